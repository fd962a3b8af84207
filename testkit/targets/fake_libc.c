/* Built as "libc.so.6" with -nostdlib: a file that names the functions
 * papirus looks up in a target's libc (loader, allocator, threads) at
 * offsets unlike the real libc's, each trapping. A tool that reads this
 * file instead of the libc the target mapped computes wrong addresses. */
#define TRAP(name) void name(void) { __builtin_trap(); }
TRAP(dlopen)
TRAP(dlsym)
TRAP(dlerror)
TRAP(__libc_dlopen_mode)
TRAP(__libc_dlsym)
TRAP(pthread_create)
TRAP(pthread_detach)
TRAP(malloc)
TRAP(free)
TRAP(calloc)
TRAP(realloc)
