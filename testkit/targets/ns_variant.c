/* Two builds of one library: -DVARIANT=1 (the file the tool sees) and
 * -DVARIANT=2 (the file a target in another mount namespace maps at the
 * same path). Variant 2 has other functions first, so variant_fn sits at
 * another offset, and returns another value. */
#if VARIANT == 2
__attribute__((noinline)) int b_only_1(int x) { return x * 7 + 3; }
__attribute__((noinline)) int b_only_2(int x) { return x * 11 + b_only_1(x); }
__attribute__((noinline)) int b_only_3(int x) { return x * 13 + b_only_2(x); }
#else
__attribute__((noinline)) int a_only(int x) { return x - 1; }
#endif

int variant_id(void) { return VARIANT; }

__attribute__((noinline)) int variant_fn(int x) { return VARIANT * 1000 + x; }
