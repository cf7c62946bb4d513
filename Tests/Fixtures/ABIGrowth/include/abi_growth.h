/* Fixture: ABIGrowth has no public interface. */
