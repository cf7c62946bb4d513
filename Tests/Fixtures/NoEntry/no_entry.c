/* Fixture: a shared library that is not a bgtask plugin (no entry symbol). */
__attribute__((visibility("default"))) int not_a_plugin(void) { return 42; }
