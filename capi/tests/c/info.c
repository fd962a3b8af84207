/* Information queries: hardware, executable, shared libraries, memory, errors. */
#include <unistd.h>
#include "check.h"

int main(void) {
    CHECK(PAPI_get_hardware_info() == NULL);                      /* before init */
    init_or_die();
    const PAPI_hw_info_t *hw = PAPI_get_hardware_info();
    CHECK(hw != NULL);
    if (!hw) return finish("info");
    CHECK(hw->totalcpus == sysconf(_SC_NPROCESSORS_ONLN));
    CHECK(hw->vendor_string[0] != 0 && hw->model_string[0] != 0);
    CHECK(hw->cpu_max_mhz > 0);
    KV("totalcpus", "%d", hw->totalcpus);
    KV("vendor", "%s", hw->vendor_string);
    KV("model_string", "%s", hw->model_string);
    KV("virtualized", "%d", hw->virtualized);
    const PAPI_exe_info_t *exe = PAPI_get_executable_info();
    CHECK(exe != NULL);
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    CHECK(exe && strcmp(exe->fullname, self) == 0);
    CHECK(exe && (char *)exe->address_info.text_start <= (char *)main && (char *)main < (char *)exe->address_info.text_end);
    const PAPI_shlib_info_t *sh = PAPI_get_shared_lib_info();
    CHECK(sh != NULL && sh->count > 0);
    int libc = 0;
    for (int i = 0; sh && i < sh->count; i++) libc |= strstr(sh->map[i].name, "libc.so") != NULL;
    CHECK(libc);
    PAPI_dmem_info_t d;
    CHECK_RC(PAPI_get_dmem_info(&d), PAPI_OK);
    CHECK(d.size > 0 && d.resident > 0 && d.pagesize == 4096);
    CHECK_RC(PAPI_get_dmem_info(NULL), PAPI_EINVAL);
    CHECK(PAPI_strerror(PAPI_ENOEVNT) != NULL);
    CHECK(PAPI_strerror(1) == NULL);
    KV("strerror_count", "%d", PAPI_NUM_ERRORS);
    return finish("info");
}
