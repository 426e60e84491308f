/*
 * processes.c - the stand-in NVML's memory, process-list and utilization
 * calls, answered from the scenario that fakenvml.c read (see its header for
 * the scenario format).
 */
#include <stddef.h>
#include <time.h>

#include "fakenvml.h"

/* Does process p belong to device d (a whole GPU, or one MIG instance)? */
static int proc_on(const proc_t *p, const device_t *d, int match_ci)
{
    if (!d->is_mig) return p->gpu == d->index;
    return p->gpu == d->gpu && p->gi == d->gi && (!match_ci || p->ci == d->ci);
}

/* Memory used = the explicit mem_used, else the sum over distinct pids of its
 * processes: all of them, whatever the caller's PID namespace, as the driver. */
static unsigned long long used_of(const device_t *d)
{
    unsigned long long sum = 0;
    if (d->mem_used != NA) return d->mem_used;
    for (int i = 0; i < cur.nprocs; i++) {
        const proc_t *p = &cur.procs[i];
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= cur.procs[j].pid == p->pid && proc_on(&cur.procs[j], d, 0);
        if (proc_on(p, d, 0) && !dup && p->mem != NA) sum += p->mem;
    }
    return sum;
}

nvmlReturn_t API nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m)
{
    NEED_INIT();
    refresh();
    device_t *d = any_dev(h);
    if (!d || !m) return E_INVALID;
    if (m->version != nvmlMemory_v2) return E_VERSION;
    m->total = d->mem_total;
    m->reserved = d->reserved;
    m->used = used_of(d);
    m->free = m->used + m->reserved < m->total ? m->total - m->used - m->reserved : 0;
    return OK;
}

/* The v1 layout has no reserved field: the driver counts the reservation as used. */
nvmlReturn_t API nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m)
{
    nvmlMemory_v2_t v2 = { .version = nvmlMemory_v2 };
    nvmlReturn_t r = nvmlDeviceGetMemoryInfo_v2(h, m ? &v2 : NULL);
    if (r != OK) return r;
    *m = (nvmlMemory_t){ .total = v2.total, .free = v2.free, .used = v2.used + v2.reserved };
    return OK;
}

/* The driver lists only the processes of the caller's PID namespace, under
 * the pids that namespace gives them (a caller in the initial namespace sees
 * them all, with host pids). Is p listed to the caller? If so, *pid is the
 * pid it is listed under. A process without namespace data is listed as given. */
static int visible(const proc_t *p, unsigned int *pid)
{
    *pid = p->pid;
    for (int k = 0; k < p->nns; k++)
        if (p->pidns[k] == cur.caller_ns) { *pid = p->nspid[k]; return 1; }
    return !p->nns || cur.caller_ns == PROC_PID_INIT_INO;
}

/* The NVML list protocol: with *count too small (e.g. 0 and a NULL array),
 * report the needed count and NVML_ERROR_INSUFFICIENT_SIZE; an empty list is
 * *count = 0 and SUCCESS. On a MIG handle, list that instance's processes. */
static nvmlReturn_t procs(nvmlDevice_t h, unsigned int kind, unsigned int *count, nvmlProcessInfo_t *out)
{
    NEED_INIT();
    refresh();
    device_t *d = any_dev(h);
    unsigned int n = 0, cap, pid;
    if (!d || !count) return E_INVALID;
    cap = *count;
    for (int i = 0; i < cur.nprocs; i++) {
        const proc_t *p = &cur.procs[i];
        if (p->kind != kind || !proc_on(p, d, 1) || !visible(p, &pid)) continue;
        if (n < cap && out)
            out[n] = (nvmlProcessInfo_t){ pid, p->mem, p->gi, p->ci };
        n++;
    }
    *count = n;
    return n > cap || (n && !out) ? E_SIZE : OK;
}

#define PROC_LIST(fn, kind) \
    nvmlReturn_t API fn(nvmlDevice_t h, unsigned int *c, nvmlProcessInfo_t *p) { return procs(h, kind, c, p); }
PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v3, 0)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, 1)
PROC_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, 2)
/* The _v2 entry points use the identical nvmlProcessInfo_v2_t layout. */
PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v2, 0)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, 1)
PROC_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, 2)

/* Utilization is not reported in MIG mode (nvidia-smi shows N/A). */
static device_t *util_dev(nvmlDevice_t h, nvmlReturn_t *r)
{
    device_t *d = any_dev(h);
    *r = !d ? E_INVALID : d->is_mig || d->mig ? E_NOT_SUPPORTED : OK;
    return *r == OK ? d : NULL;
}

nvmlReturn_t API nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u)
{
    NEED_INIT();
    nvmlReturn_t r;
    device_t *d = util_dev(h, &r);
    if (!d || !u) return d ? E_INVALID : r;
    *u = (nvmlUtilization_t){ d->util, d->mem_util };
    return OK;
}

/* One sample per distinct pid with an sm= field, newer than lastSeen (all
 * are stamped now), under its host pid whatever the caller's namespace. The
 * size protocol pynvml uses: samples NULL or *count too small gives the
 * count and INSUFFICIENT_SIZE; no sample at all is NOT_FOUND, as the driver. */
nvmlReturn_t API nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *out,
                                                 unsigned int *count, unsigned long long lastSeen)
{
    NEED_INIT();
    refresh();
    nvmlReturn_t r;
    device_t *d = util_dev(h, &r);
    struct timespec ts;
    unsigned int n = 0, cap;
    if (!d || !count) return d ? E_INVALID : r;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now = ts.tv_sec * 1000000ULL + ts.tv_nsec / 1000;
    cap = *count;
    for (int i = 0; i < cur.nprocs && lastSeen < now; i++) {
        const proc_t *p = &cur.procs[i];
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= cur.procs[j].pid == p->pid && cur.procs[j].sm != NO_ID && proc_on(&cur.procs[j], d, 0);
        if (!proc_on(p, d, 0) || p->sm == NO_ID || dup) continue;
        if (out && n < cap) out[n] = (nvmlProcessUtilizationSample_t){ p->pid, now, p->sm, 0, 0, 0 };
        n++;
    }
    *count = n;
    if (!n) return E_NOT_FOUND;
    return n > cap || !out ? E_SIZE : OK;
}
