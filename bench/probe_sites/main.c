/* Calls bump() through the PLT N times and prints the CPU time per call:
 * with a uprobe on one of the instructions on that path, the added time is
 * what the kernel takes to handle the probe there (bench.py's
 * probe_site_table). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void bump(int *p);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int counter = 0;
    struct timespec a, b;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++)
        bump(&counter);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return counter != n;
}
