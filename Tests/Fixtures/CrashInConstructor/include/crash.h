/* Fixture: CrashInConstructor has no public interface. */
