/* papi_avail: PAPI's presets, whether each can be counted here, and why not. */
#include "tool.h"

static void usage(void) {
    printf("Usage: papi_avail [-a] [-d] [-e EVENT] [-h]\n"
           "  -a        only the presets available here\n"
           "  -d        details: each preset's native terms, and why it is unavailable\n"
           "  -e EVENT  everything about one event (preset or native name)\n"
           "  -h        this help\n");
}

static void one(const char *name) {
    int code;
    PAPI_event_info_t info;
    int r = PAPI_event_name_to_code(name, &code);
    if (r != PAPI_OK) die(name, r);
    if ((r = PAPI_get_event_info(code, &info)) != PAPI_OK) die(name, r);
    printf("Event name:     %s\nEvent Code:     0x%x\nNumber of Native Events: %u\n", info.symbol, info.event_code, info.count);
    printf("Short Description: |%s|\nLong Description: |%s|\n", info.short_descr, info.long_descr);
    printf("Developer's Notes: |%s|\nDerived Type: |%s|\nPostfix Processing String: |%s|\n", info.note, info.derived,
           info.postfix);
    for (unsigned i = 0; i < info.count; i++) printf(" Native Code[%u]: 0x%x |%s|\n", i, info.code[i], info.name[i]);
    printf("Available here: %s\n", PAPI_query_event(code) == PAPI_OK ? "yes" : "no");
}

int main(int argc, char **argv) {
    int avail_only = 0, details = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-a")) avail_only = 1;
        else if (!strcmp(argv[i], "-d")) details = 1;
        else if (!strcmp(argv[i], "-e") && i + 1 < argc) { init(); one(argv[++i]); return 0; }
        else { usage(); return strcmp(argv[i], "-h") && strcmp(argv[i], "--help") ? 1 : 0; }
    }
    init();
    print_hardware();
    printf("================================================================================\n");
    printf("  PAPI Preset Events\n");
    printf("================================================================================\n");
    printf("    Name        Code    Avail Deriv Description (Note)\n");
    int code = PAPI_PRESET_MASK, total = 0, avail = 0, derived = 0;
    if (PAPI_enum_event(&code, PAPI_ENUM_FIRST) != PAPI_OK) return 1;
    do {
        PAPI_event_info_t info;
        if (PAPI_get_event_info(code, &info) != PAPI_OK) continue;
        int ok = info.count > 0, der = ok && strcmp(info.derived, "NOT_DERIVED") != 0;
        total++;
        avail += ok;
        derived += der;
        if (avail_only && !ok) continue;
        printf("%-13s0x%08x  %-4s%-4s %s\n", info.symbol, info.event_code, ok ? "Yes" : "No", der ? "Yes" : "No",
               info.long_descr);
        if (details && !ok) printf("             (%s)\n", info.note);
        for (unsigned i = 0; details && i < info.count; i++) printf("             %s\n", info.name[i]);
    } while (PAPI_enum_event(&code, PAPI_ENUM_EVENTS) == PAPI_OK);
    printf("--------------------------------------------------------------------------------\n");
    printf("Of %d possible events, %d are available, of which %d are derived.\n\n", total, avail, derived);
    if (avail == 0)
        printf("No hardware counters here: count native software events instead (papi_native_avail lists them).\n");
    return 0;
}
