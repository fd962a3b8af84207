/* __m256 arguments and return, built with -mavx2 when the CPU has it. */
#include <immintrin.h>

__attribute__((noinline)) __m256 vfma(__m256 a, __m256 b, __m256 c) {
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
}

void call_vfma(const float *a, const float *b, const float *c, float *out) {
    _mm256_storeu_ps(out, vfma(_mm256_loadu_ps(a), _mm256_loadu_ps(b), _mm256_loadu_ps(c)));
}
