/* The high-level API: nested regions, a read inside, a repeated region.
   The output file is checked by the test (and by papi_hl_output_writer).
   (Ending a region out of order is EINVAL in both libraries, but PAPI then
   turns its high-level API off for good, so it is not tried here.) */
#include "check.h"

int main(void) {
    print_library();
    CHECK_RC(PAPI_hl_region_end("never-begun"), PAPI_EMISC);
    CHECK_RC(PAPI_hl_region_begin("computation"), PAPI_OK);
    touch_pages(500);
    spin_ms(100);   /* CPU time the page faults cannot blur */
    CHECK_RC(PAPI_hl_region_begin("inner"), PAPI_OK);
    touch_pages(300);
    CHECK_RC(PAPI_hl_read("inner"), PAPI_OK);
    touch_pages(200);
    CHECK_RC(PAPI_hl_region_end("inner"), PAPI_OK);
    CHECK_RC(PAPI_hl_region_end("computation"), PAPI_OK);
    CHECK_RC(PAPI_hl_region_begin("computation"), PAPI_OK);
    touch_pages(100);
    CHECK_RC(PAPI_hl_region_end("computation"), PAPI_OK);
    CHECK_RC(PAPI_hl_stop(), PAPI_OK);
    return finish("hl");
}
