/* Event names and codes both ways, queries that agree with adds, event info. */
#include "check.h"

static int addable(int code) {
    int es = PAPI_NULL, ok;
    PAPI_create_eventset(&es);
    ok = PAPI_add_event(es, code) == PAPI_OK;
    PAPI_cleanup_eventset(es);
    PAPI_destroy_eventset(&es);
    return ok;
}

int main(void) {
    init_or_die();
    int code = 0, code2 = 0;
    char name[PAPI_MAX_STR_LEN];
    CHECK_RC(PAPI_event_name_to_code("PAPI_TOT_CYC", &code), PAPI_OK);
    CHECK(code == PAPI_TOT_CYC);
    CHECK_RC(PAPI_event_code_to_name(PAPI_L1_DCM, name), PAPI_OK);
    CHECK(strcmp(name, "PAPI_L1_DCM") == 0);
    CHECK_RC(PAPI_event_code_to_name(PAPI_PRESET_MASK | 200, name), PAPI_ENOTPRESET);
    CHECK(PAPI_event_name_to_code("PAPI_NO_SUCH", &code) < 0);
    CHECK_RC(PAPI_event_name_to_code(NULL, &code), PAPI_EINVAL);
    /* PAPI's spellings of perf's software events. */
    const char *spellings[] = {"perf::TASK-CLOCK", "perf::PAGE-FAULTS", "perf::task-clock",
                               "perf_event:::perf::TASK-CLOCK", "perf::CONTEXT-SWITCHES"};
    for (unsigned i = 0; i < sizeof spellings / sizeof *spellings; i++) {
        CHECK_RC(PAPI_event_name_to_code(spellings[i], &code), PAPI_OK);
        CHECK(IS_NATIVE(code));
        CHECK_RC(PAPI_event_code_to_name(code, name), PAPI_OK);
        CHECK_RC(PAPI_query_event(code), PAPI_OK);
        CHECK(addable(code));
    }
    /* The same spelling keeps its code. */
    PAPI_event_name_to_code("perf::TASK-CLOCK", &code);
    PAPI_event_name_to_code("perf::TASK-CLOCK", &code2);
    CHECK(code == code2);
    CHECK_RC(PAPI_query_named_event("perf::NO-SUCH-EVENT"), PAPI_ENOEVNT);
    /* Every preset: the query and the info agree with what adding does. */
    int presets = 0, available = 0, disagree = 0;
    code = PAPI_PRESET_MASK;
    CHECK_RC(PAPI_enum_event(&code, PAPI_ENUM_FIRST), PAPI_OK);
    do {
        PAPI_event_info_t info;
        CHECK_RC(PAPI_get_event_info(code, &info), PAPI_OK);
        int q = PAPI_query_event(code) == PAPI_OK, a = addable(code);
        presets++;
        available += a;
        if (q != a || (info.count > 0) != a) disagree++;
        /* Its categories, which papi_avail --br, --cache, ... filter by. */
        printf("kv event_type_%s 0x%x\n", info.symbol, info.event_type);
    } while (PAPI_enum_event(&code, PAPI_ENUM_EVENTS) == PAPI_OK);
    KV("presets", "%d", presets);
    KV("query_add_disagree", "%d", disagree);
    CHECK(presets == PAPI_END_idx);
    int avail_enum = 0;
    code = PAPI_PRESET_MASK;
    if (PAPI_enum_event(&code, PAPI_PRESET_ENUM_AVAIL) == PAPI_OK) {
        do avail_enum++; while (PAPI_enum_event(&code, PAPI_PRESET_ENUM_AVAIL) == PAPI_OK);
    }
    printf("available presets %d (enumerated as available: %d)\n", available, avail_enum);
    /* Native event info. */
    PAPI_event_info_t info;
    PAPI_event_name_to_code("perf::PAGE-FAULTS", &code);
    CHECK_RC(PAPI_get_event_info(code, &info), PAPI_OK);
    CHECK(strcmp(info.symbol, "perf::PAGE-FAULTS") == 0);
    CHECK(info.component_index == 0);
    CHECK_RC(PAPI_get_event_info(code, NULL), PAPI_EINVAL);
    return finish("names");
}
