/* The machine's memory read bandwidth, for the speed floor of bench/peers.py: a token cannot be decoded faster
 * than the bytes of weights its pass reads divided by this rate.
 *
 *   read_bandwidth THREADS [MIB]     # prints one JSON object: bytes_per_s (the best of 9 passes), mib, threads
 *
 * Sums a buffer of MIB mebibytes (default 1024, far above the caches) as 64-bit integers in STREAMS
 * interleaved sequential streams, split among THREADS OpenMP threads; the sum is printed so the compiler keeps
 * the reads. Built -O3 -march=native -fopenmp. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define STREAMS 8

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const long mib = argc > 2 ? atol(argv[2]) : 1024;
    if (threads < 1 || mib < 64) {
        fprintf(stderr, "usage: %s THREADS [MIB >= 64]\n", argv[0]);
        return 2;
    }
    const size_t count = (size_t)mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *data = malloc(count * sizeof(uint64_t));
    if (data == NULL) return 1;
    for (size_t i = 0; i < count; ++i) data[i] = i;  /* touch every page before timing */
    double best = 1e30;
    uint64_t total = 0;
    for (int pass = 0; pass < 9; ++pass) {
        const double start = now_s();
        uint64_t sum = 0;
        /* STREAMS sequential streams at once per thread: one stream leaves the core's memory-level
         * parallelism unused (a single sequential read measured about half the rate the block products
         * reach on the same machine), so the floor would be too low */
        const size_t span = count / STREAMS;
#pragma omp parallel for num_threads(threads) reduction(+ : sum) schedule(static)
        for (size_t i = 0; i < span; ++i) {
            uint64_t partial = 0;
            for (int s = 0; s < STREAMS; ++s) partial += data[(size_t)s * span + i];
            sum += partial;
        }
        const double seconds = now_s() - start;
        total += sum;
        if (seconds < best) best = seconds;
    }
    printf("{\"bytes_per_s\": %.0f, \"mib\": %ld, \"threads\": %d, \"checksum\": %llu}\n",
           (double)(count * sizeof(uint64_t)) / best, mib, threads, (unsigned long long)(total & 0xffff));
    free(data);
    return 0;
}
