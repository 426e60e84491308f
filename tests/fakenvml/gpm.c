/*
 * gpm.c - the stand-in NVML's GPU Performance Monitoring calls (nvml.h's nvmlGpm*), answered
 * from the scenario's gpm lines (see fakenvml.c's header), in the shapes and with the return
 * codes nvml.h gives them: support by architecture (Hopper or newer), samples allocated and
 * freed by the caller, and metrics computed between two samples of the same GPU, each metric
 * with its own nvmlReturn.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakenvml.h"

enum { GPM_SUPPORT_VERSION = 1, GPM_METRICS_GET_VERSION = 1, GPM_MAGIC = 0x67706d31 };

typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { unsigned int magic; int taken; unsigned int gpu; double at; } sample_t;
typedef sample_t *nvmlGpmSample_t;
typedef struct { char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned int metricId; nvmlReturn_t nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; } nvmlGpmMetric_t;
typedef struct { unsigned int version, numMetrics; nvmlGpmSample_t sample1, sample2; nvmlGpmMetric_t metrics[]; } nvmlGpmMetricsGet_t;
#define GPM_METRICS_BOUND 1024  /* the fake's own bound on a caller's array (not a measured one) */

static int supported(const device_t *d)
{
    return d->gpm == NO_ID ? d->arch >= 9 : d->gpm != 0;
}

nvmlReturn_t API nvmlGpmQueryDeviceSupport(nvmlDevice_t h, nvmlGpmSupport_t *support)
{
    NEED_INIT();
    device_t *d = gpu_dev(h);
    if (!d || !support) return E_INVALID;
    if (support->version != GPM_SUPPORT_VERSION) return E_VERSION;
    support->isSupportedDevice = supported(d);
    return OK;
}

nvmlReturn_t API nvmlGpmSampleAlloc(nvmlGpmSample_t *sample)
{
    NEED_INIT();
    if (!sample) return E_INVALID;
    sample_t *s = calloc(1, sizeof *s);
    if (!s) return E_UNKNOWN;
    s->magic = GPM_MAGIC;
    *sample = s;
    return OK;
}

nvmlReturn_t API nvmlGpmSampleFree(nvmlGpmSample_t sample)
{
    NEED_INIT();
    if (!sample || sample->magic != GPM_MAGIC) return E_INVALID;
    sample->magic = 0;
    free(sample);
    return OK;
}

nvmlReturn_t API nvmlGpmSampleGet(nvmlDevice_t h, nvmlGpmSample_t sample)
{
    NEED_INIT();
    refresh();
    device_t *d = gpu_dev(h);
    struct timespec now;
    if (!d || !sample || sample->magic != GPM_MAGIC) return E_INVALID;
    if (!supported(d)) return E_NOT_SUPPORTED;
    clock_gettime(CLOCK_MONOTONIC, &now);
    sample->taken = 1;
    sample->gpu = d->index;
    sample->at = now.tv_sec + now.tv_nsec / 1e9;
    return OK;
}

static const gpm_t *recorded(unsigned int gpu, unsigned int id)
{
    for (int i = 0; i < cur.ngpm; i++)
        if (cur.gpm[i].gpu == gpu && cur.gpm[i].id == id) return &cur.gpm[i];
    return NULL;
}

nvmlReturn_t API nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *req)
{
    NEED_INIT();
    refresh();
    if (!req) return E_INVALID;
    if (req->version != GPM_METRICS_GET_VERSION) return E_VERSION;
    nvmlGpmSample_t a = req->sample1, b = req->sample2;
    if (!a || !b || a->magic != GPM_MAGIC || b->magic != GPM_MAGIC || !a->taken || !b->taken ||
        a->gpu != b->gpu || req->numMetrics == 0 || req->numMetrics > GPM_METRICS_BOUND)
        return E_INVALID;
    for (unsigned int i = 0; i < req->numMetrics; i++) {
        nvmlGpmMetric_t *m = &req->metrics[i];
        const gpm_t *r = recorded(a->gpu, m->metricId);
        m->nvmlReturn = r ? r->ret : E_NOT_SUPPORTED;
        m->value = r ? r->value : 0.0;
        memset(&m->metricInfo, 0, sizeof m->metricInfo);
    }
    return OK;
}
