/* Rates: PAPI_flops_rate and friends need hardware events; where these
   cannot be counted the call says so (ENOEVNT), consistently with the query. */
#include "check.h"

int main(void) {
    init_or_die();
    float rt, pt, rate;
    long long count, ref, core, evt;
    CHECK_RC(PAPI_rate_stop(), PAPI_ENOEVNT);                    /* nothing running */
    CHECK_RC(PAPI_flops_rate(PAPI_FP_OPS, NULL, &pt, &count, &rate), PAPI_EINVAL);
    CHECK_RC(PAPI_flops_rate(PAPI_TOT_CYC, &rt, &pt, &count, &rate), PAPI_ENOEVNT);  /* not a flop event */
    int r = PAPI_ipc(&rt, &pt, &count, &rate);
    int have = PAPI_query_event(PAPI_TOT_INS) == PAPI_OK && PAPI_query_event(PAPI_TOT_CYC) == PAPI_OK;
    if (have) {
        CHECK_RC(r, PAPI_OK);
        spin_ms(20);
        CHECK_RC(PAPI_ipc(&rt, &pt, &count, &rate), PAPI_OK);
        CHECK(count > 0 && rate > 0);
        CHECK_RC(PAPI_rate_stop(), PAPI_OK);
    } else {
        CHECK(r < 0);
        printf("ipc: %s\n", PAPI_strerror(r));
    }
    r = PAPI_epc(0, &rt, &pt, &ref, &core, &evt, &rate);
    CHECK(have ? r == PAPI_OK : r < 0);
    return finish("rates");
}
