/* Fixture: EntryFails has no public interface. */
