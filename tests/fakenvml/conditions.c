/*
 * conditions.c - the stand-in NVML's clocks, clock event reasons, temperature, power and fan,
 * answered from the scenario (see fakenvml.c's header): the values and the NOT_SUPPORTED
 * answers an H200 gave (tests/fixtures/tools-2025.3-h200/nvml-conditions).
 */
#include <stddef.h>

#include "fakenvml.h"

enum { CLOCK_GRAPHICS = 0, CLOCK_SM = 1, CLOCK_MEM = 2, CLOCK_VIDEO = 3, TEMPERATURE_GPU = 0 };

static nvmlReturn_t answer(unsigned int value, unsigned int *out)
{
    if (value == NO_ID) return E_NOT_SUPPORTED;
    *out = value;
    return OK;
}

nvmlReturn_t API nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *clock)
{
    NEED_INIT();
    refresh();
    device_t *d = gpu_dev(h);
    if (!d || !clock) return E_INVALID;
    switch (type) {
    case CLOCK_GRAPHICS: case CLOCK_SM: return answer(d->sm_clock, clock);  /* the same clock on an H200 */
    case CLOCK_MEM: return answer(d->mem_clock, clock);
    case CLOCK_VIDEO: return answer(d->video_clock, clock);
    default: return E_INVALID;
    }
}

static nvmlReturn_t reasons(nvmlDevice_t h, unsigned long long *out)
{
    NEED_INIT();
    refresh();
    device_t *d = gpu_dev(h);
    if (!d || !out) return E_INVALID;
    if (d->reasons == NA) return E_NOT_SUPPORTED;
    *out = d->reasons;
    return OK;
}
nvmlReturn_t API nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *r) { return reasons(h, r); }
nvmlReturn_t API nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long *r) { return reasons(h, r); }

nvmlReturn_t API nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *temp)
{
    NEED_INIT();
    refresh();
    device_t *d = gpu_dev(h);
    if (!d || !temp || sensor != TEMPERATURE_GPU) return E_INVALID;
    return answer(d->temp, temp);
}

nvmlReturn_t API nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *milliwatts)
{
    NEED_INIT();
    refresh();
    device_t *d = gpu_dev(h);
    if (!d || !milliwatts) return E_INVALID;
    return answer(d->power, milliwatts);
}

/* An H200 answered Not Supported (3): it has no fan of its own. */
nvmlReturn_t API nvmlDeviceGetFanSpeed(nvmlDevice_t h, unsigned int *speed)
{
    NEED_INIT();
    return gpu_dev(h) && speed ? E_NOT_SUPPORTED : E_INVALID;
}
