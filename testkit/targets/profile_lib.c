/* A library profile_multi loads with dlopen after the profiler started. */
#include "papirus_target.h"

void lib_spin(void) { spin(1); }
