/* papi_native_avail: the native events of each component. */
#include "tool.h"

int main(int argc, char **argv) {
    int check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check") || !strcmp(argv[i], "-c")) check = 1;
        else {
            printf("Usage: papi_native_avail [--check] [-h]\n"
                   "  --check  try to add each event to an event set and mark those that count here\n"
                   "Tracepoints (subsystem:event) are accepted by name but not listed.\n");
            return strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? 1 : 0;
        }
    }
    init();
    print_hardware();
    int total = 0;
    for (int cidx = 0; cidx < PAPI_num_components(); cidx++) {
        const PAPI_component_info_t *c = PAPI_get_component_info(cidx);
        if (!c) continue;
        printf("===============================================================================\n");
        printf(" Native Events in Component: %s\n", c->name);
        printf("===============================================================================\n");
        if (c->disabled) { printf(" Disabled: %s\n\n", c->disabled_reason); continue; }
        int code = PAPI_NATIVE_MASK;
        int r = PAPI_enum_cmp_event(&code, PAPI_ENUM_FIRST, cidx);
        while (r == PAPI_OK) {
            PAPI_event_info_t info;
            if (PAPI_get_event_info(code, &info) == PAPI_OK) {
                const char *mark = "";
                if (check) {
                    int es = PAPI_NULL;
                    PAPI_create_eventset(&es);
                    mark = PAPI_add_event(es, code) == PAPI_OK ? "  <-- counts here" : "  (cannot be counted here)";
                    PAPI_cleanup_eventset(es);
                    PAPI_destroy_eventset(&es);
                }
                printf("| %-40s%s\n|            %s\n", info.symbol, mark, info.long_descr);
                printf("--------------------------------------------------------------------------------\n");
                total++;
            }
            r = PAPI_enum_cmp_event(&code, PAPI_ENUM_EVENTS, cidx);
        }
    }
    printf("\nTotal events reported: %d\n", total);
    return 0;
}
