/* Components: papirus' perf PMUs seen as PAPI's perf_event component. */
#include "check.h"

int main(void) {
    CHECK_RC(PAPI_disable_component_by_name("no-such-component"), PAPI_ENOCMP);
    init_or_die();
    CHECK_RC(PAPI_disable_component(0), PAPI_ENOINIT);          /* only before init */
    int n = PAPI_num_components();
    CHECK(n >= 1);
    const PAPI_component_info_t *c = PAPI_get_component_info(0);
    CHECK(c != NULL);
    if (!c) return finish("components");
    CHECK(strcmp(c->name, "perf_event") == 0);
    CHECK(c->disabled == 0);
    CHECK(c->num_native_events > 0);
    CHECK(c->pmu_names[0] != NULL);
    CHECK(PAPI_get_component_info(n) == NULL);
    CHECK(PAPI_get_component_index("perf_event") == 0);
    CHECK_RC(PAPI_get_component_index("perf"), PAPI_ENOCMP);
    int code, count = 0;
    PAPI_event_name_to_code("perf::TASK-CLOCK", &code);
    CHECK(PAPI_get_event_component(code) == 0);
    CHECK(PAPI_get_event_component(PAPI_TOT_INS) == 0);
    code = PAPI_NATIVE_MASK;
    int r = PAPI_enum_cmp_event(&code, PAPI_ENUM_FIRST, 0);
    while (r == PAPI_OK) {
        char name[PAPI_MAX_STR_LEN];
        CHECK_RC(PAPI_event_code_to_name(code, name), PAPI_OK);
        count++;
        r = PAPI_enum_cmp_event(&code, PAPI_ENUM_EVENTS, 0);
    }
    CHECK(count > 0);
    printf("component 0 %s: %d native events enumerated, %d counters\n", c->name, count, PAPI_num_cmp_hwctrs(0));
    int es = PAPI_NULL;
    PAPI_create_eventset(&es);
    CHECK_RC(PAPI_get_eventset_component(es), PAPI_ENOCMP);
    CHECK_RC(PAPI_assign_eventset_component(es, 99), PAPI_ENOCMP);
    CHECK_RC(PAPI_add_named_event(es, "perf::TASK-CLOCK"), PAPI_OK);
    CHECK(PAPI_get_eventset_component(es) == 0);
    CHECK(PAPI_num_cmp_hwctrs(99) < 0);
    return finish("components");
}
