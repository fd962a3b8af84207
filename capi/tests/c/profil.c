/* PAPI_profil and PAPI_sprofil: a PC histogram of a hot function. */
#include "check.h"

__attribute__((noinline)) static double hot(int ms) {
    spin_ms(ms);
    return sink;
}

static unsigned long total(unsigned short *b, int n) {
    unsigned long t = 0;
    for (int i = 0; i < n; i++) t += b[i];
    return t;
}

int main(void) {
    init_or_die();
    int es = PAPI_NULL, code;
    long long v[1];
    PAPI_create_eventset(&es);
    PAPI_event_name_to_code("perf::TASK-CLOCK", &code);
    CHECK_RC(PAPI_add_event(es, code), PAPI_OK);
    /* The whole executable's text, one bucket per 4 bytes. */
    const PAPI_exe_info_t *exe = PAPI_get_executable_info();
    CHECK(exe != NULL);
    if (!exe) return finish("profil");
    char *start = exe->address_info.text_start, *end = exe->address_info.text_end;
    unsigned bytes = (unsigned)((end - start) / 4 + 1) * 2;
    unsigned short *buf = calloc(bytes, 1);
    CHECK_RC(PAPI_profil(buf, bytes, start, 32768, es, code, 1000000, PAPI_PROFIL_POSIX), PAPI_OK);
    int st = 0;
    PAPI_state(es, &st);
    CHECK(st & PAPI_PROFILING);
    CHECK_RC(PAPI_start(es), PAPI_OK);
    hot(200);
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    unsigned long in_text = total(buf, (int)(bytes / 2));
    printf("profil: %lu samples in the executable's text for %lld ns\n", in_text, v[0]);
    CHECK(in_text >= (unsigned long)(v[0] / 1000000) / 2);
    CHECK_RC(PAPI_profil(buf, bytes, start, 32768, es, code, 0, PAPI_PROFIL_POSIX), PAPI_OK);
    /* Two regions: the executable and a region nothing runs in. */
    unsigned short *b2 = calloc(bytes, 1), *empty = calloc(64, 2);
    PAPI_sprofil_t r[2] = {
        {b2, bytes, start, 32768},
        {empty, 128, (void *)16, 65536},
    };
    CHECK_RC(PAPI_sprofil(r, 2, es, code, 1000000, PAPI_PROFIL_POSIX), PAPI_OK);
    CHECK_RC(PAPI_start(es), PAPI_OK);
    hot(100);
    CHECK_RC(PAPI_stop(es, v), PAPI_OK);
    CHECK(total(b2, (int)(bytes / 2)) > 0);
    CHECK(total(empty, 64) == 0);
    return finish("profil");
}
