/* BenchPlugin: see bench.c */
