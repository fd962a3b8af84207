/* A small shared library for the papirus-probe command-line tests: four
   exported functions, two of which the tests exclude. Built with gcc -O2. */
volatile long cli_sink;

__attribute__((noinline)) long lib_a(long x) { cli_sink += x; return x + 1; }
__attribute__((noinline)) long lib_b(long x) { cli_sink ^= x; return x * 3; }
__attribute__((noinline)) long lib_c(long x) { cli_sink -= x; return x - 1; }
__attribute__((noinline)) long lib_d(long x) { cli_sink |= x; return x / 2 + 1; }
