// A C++ program whose exceptions cross three frames, one with a destructor.
#include <cstdio>

#include "papirus_target.h"

int main() {
    int sum = 0;
    for (int i = 0; i < 6; i++) sum += run_exc(i % 3);
    std::printf("sum=%d destroyed=%ld\n", sum, destroyed);
    return 0;
}
