/* Fixture: BadABI has no public interface. */
