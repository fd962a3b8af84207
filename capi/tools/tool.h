/* What papirus' PAPI tools share. */
#ifndef PAPIRUS_TOOL_H
#define PAPIRUS_TOOL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <papi.h>

static inline void die(const char *what, int code) {
    fprintf(stderr, "%s: %s\n", what, PAPI_strerror(code) ? PAPI_strerror(code) : "unknown error");
    exit(1);
}

static inline void init(void) {
    int r = PAPI_library_init(PAPI_VER_CURRENT);
    if (r != PAPI_VER_CURRENT) die("PAPI_library_init", r);
}

/* The hardware block PAPI's tools print first. */
static inline void print_hardware(void) {
    const PAPI_hw_info_t *hw = PAPI_get_hardware_info();
    const PAPI_component_info_t *c = PAPI_get_component_info(0);
    if (!hw) return;
    printf("Available PAPI preset and user defined events plus hardware information.\n");
    printf("--------------------------------------------------------------------------------\n");
    printf("PAPI version             : %d.%d.%d.%d (papirus)\n", PAPI_VERSION_MAJOR(PAPI_VERSION),
           PAPI_VERSION_MINOR(PAPI_VERSION), PAPI_VERSION_REVISION(PAPI_VERSION), PAPI_VERSION_INCREMENT(PAPI_VERSION));
    printf("Vendor string and code   : %s (%d, 0x%x)\n", hw->vendor_string, hw->vendor, hw->vendor);
    printf("Model string and code    : %s (%d, 0x%x)\n", hw->model_string, hw->model, hw->model);
    printf("CPUID                    : Family/Model/Stepping %d/%d/%d, 0x%02x/0x%02x/0x%02x\n", hw->cpuid_family,
           hw->cpuid_model, hw->cpuid_stepping, hw->cpuid_family, hw->cpuid_model, hw->cpuid_stepping);
    printf("CPU Max MHz              : %d\nCPU Min MHz              : %d\n", hw->cpu_max_mhz, hw->cpu_min_mhz);
    printf("Total cores              : %d\n", hw->totalcpus);
    printf("SMT threads per core     : %d\nCores per socket         : %d\n", hw->threads, hw->cores);
    printf("Sockets                  : %d\nCores per NUMA region    : %d\nNUMA regions             : %d\n",
           hw->sockets, hw->ncpu, hw->nnodes);
    printf("Running in a VM          : %s\n", hw->virtualized ? "yes" : "no");
    if (hw->virtualized) printf("VM Vendor                : %s\n", hw->virtual_vendor_string);
    printf("Number Hardware Counters : %d\n", PAPI_num_cmp_hwctrs(0));
    printf("Max Multiplex Counters   : %d\n", PAPI_get_opt(PAPI_MAX_MPX_CTRS, NULL));
    if (c) printf("Fast counter read (rdpmc): %s\n", c->fast_counter_read ? "yes" : "no");
    printf("--------------------------------------------------------------------------------\n\n");
}
#endif
