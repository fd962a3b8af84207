/* A library profile_multi loads with dlopen after the profiler started. */
static volatile unsigned long sink;
void lib_spin(void) {
    unsigned long x = sink;
    for (unsigned long i = 0; i < 100000UL; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
}
