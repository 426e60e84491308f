/*
 * fakenvml.c - a stand-in libnvidia-ml.so.1 for GPU-less CI.
 *
 * The real Python binding (pynvml, package nvidia-ml-py) dlopens
 * "libnvidia-ml.so.1" and calls the C functions below through ctypes, so the
 * symbol names, argument lists and struct layouts here mirror nvml.h exactly.
 * What the "hardware" looks like comes from a plain-text scenario file named
 * by $FAKE_NVML_SCENARIO, re-read on every nvmlInit so a long-lived process
 * (an agent under test) sees changes between nvmlShutdown and nvmlInit.
 *
 * Scenario lines ('#' starts a comment; fields are key=value; a value may be
 * "double quoted" to hold spaces):
 *   init_error 9          nvmlInit fails with this return code
 *   driver 580.159.04     cuda 13000     nvml 13.580.159.04
 *   gpu  index= uuid= name= arch= mig= mig_pending= compute_mode= mem_total=
 *        mem_used= bus= pci_id= minor= max_mig=
 *   mig  gpu= gi= ci= uuid= name= mem_total= mem_used=
 *   proc gpu= kind=compute|graphics|mps pid= mem=<bytes>|na gi= ci=
 * Not thread-safe around nvmlInit; a test harness does not need that.
 *
 * Build: gcc -O2 -Wall -Wextra -shared -fPIC -o libnvidia-ml.so.1 fakenvml.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum { OK = 0, E_UNINIT = 1, E_INVALID = 2, E_NOT_FOUND = 6, E_SIZE = 7,
       E_NO_DRIVER = 9, E_VERSION = 25, E_UNKNOWN = 999 };

#define MAX_GPUS 64
#define MAX_MIGS 256
#define MAX_PROCS 1024
#define STR 96                      /* NVML_DEVICE_{UUID,NAME}_V2_BUFFER_SIZE */
#define NA 0xFFFFFFFFFFFFFFFFULL    /* NVML_VALUE_NOT_AVAILABLE (pynvml: None) */
#define NO_ID 0xFFFFFFFFu           /* gi/ci of a process outside MIG */

/* Layouts copied from nvml.h (and pynvml's ctypes mirrors of them). */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 0x02000028u   /* sizeof(nvmlMemory_v2_t) | 2 << 24 */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory;
                 unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId,
                 pciSubSystemId; char busId[32]; } nvmlPciInfo_t;

/* A handle (nvmlDevice_t) is a pointer to one of these. */
typedef struct dev {
    int is_mig, defined, line;
    unsigned int index, gpu, gi, ci;   /* gpu: parent index, for MIG devices */
    char uuid[STR], name[STR], bus[32];
    unsigned int arch, mig, mig_pending, compute_mode, minor, max_mig, pci_id;
    unsigned long long mem_total, mem_used; /* mem_used NA: sum of processes */
} device_t;
typedef device_t *nvmlDevice_t;
typedef struct { unsigned int gpu, kind, pid, gi, ci; unsigned long long mem; int line; } proc_t;

typedef struct {
    int init_error, cuda, ngpus, nmigs, nprocs;
    char driver[80], nvml[80];
    device_t gpus[MAX_GPUS], migs[MAX_MIGS];
    proc_t procs[MAX_PROCS];
} scenario_t;

static scenario_t cur, tmp;  /* tmp is parsed into, then copied over cur */
static int refcount;         /* nvmlInit/nvmlShutdown nest, as in real NVML */

/* ---------------------------------------------------------------- parsing */

static const char *g_file; static int g_line;
static int bad(const char *what, const char *detail)
{
    fprintf(stderr, "fakenvml: %s:%d: %s%s%s\n", g_file, g_line, what,
            detail ? ": " : "", detail ? detail : "");
    return -1;
}

/* Next whitespace-separated token; a "quoted" run keeps spaces, quotes dropped. */
static char *token(char **p)
{
    char *s = *p, *out;
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) return NULL;
    out = s;
    char *w = s;
    int quoted = 0;
    for (; *s && (quoted || (*s != ' ' && *s != '\t')); s++) {
        if (*s == '"') quoted = !quoted; else *w++ = *s;
    }
    if (*s) s++;
    *w = '\0';
    *p = s;
    return out;
}

/* Parse a non-negative number (decimal, or 0x hex) no larger than max. */
static int num(const char *v, unsigned long long max, unsigned long long *out)
{
    char *end;
    if (!*v || *v == '-') return bad("not a non-negative number", v);
    *out = strtoull(v, &end, 0);
    if (*end) return bad("not a number", v);
    return *out > max ? bad("number out of range", v) : 0;
}

static int str(const char *v, char *dst, size_t n)
{
    if (strlen(v) >= n) return bad("value too long", v);
    strcpy(dst, v);
    return 0;
}

#define IS(key) (!strcmp(kv, key))

/* Apply one key=value to a gpu/mig (d) or proc (p) record: first find which
 * field the key names (so an unknown key is reported as such), then parse. */
static int field(char *kv, device_t *d, proc_t *p)
{
    char *v = strchr(kv, '=');
    unsigned int *u32 = NULL;
    unsigned long long *u64 = NULL, n;
    if (!v) return bad("expected key=value", kv);
    *v++ = '\0';
    if (p) {
        if (IS("kind")) {
            const char *kinds[] = { "compute", "graphics", "mps" };
            for (p->kind = 0; p->kind < 3 && strcmp(v, kinds[p->kind]); p->kind++) {}
            return p->kind == 3 ? bad("kind must be compute, graphics or mps", v) : 0;
        }
        if (IS("mem") && !strcmp(v, "na")) { p->mem = NA; return 0; }
        u32 = IS("gpu") ? &p->gpu : IS("pid") ? &p->pid : IS("gi") ? &p->gi : IS("ci") ? &p->ci : NULL;
        u64 = IS("mem") ? &p->mem : NULL;
    } else if (IS("uuid")) {
        return str(v, d->uuid, sizeof d->uuid);
    } else if (IS("name")) {
        return str(v, d->name, sizeof d->name);
    } else if (IS("bus") && !d->is_mig) {
        return str(v, d->bus, sizeof d->bus);
    } else if (d->is_mig) {
        u32 = IS("gpu") ? &d->gpu : IS("gi") ? &d->gi : IS("ci") ? &d->ci : NULL;
    } else {
        u32 = IS("index") ? &d->index : IS("arch") ? &d->arch : IS("mig") ? &d->mig :
              IS("mig_pending") ? &d->mig_pending : IS("compute_mode") ? &d->compute_mode :
              IS("minor") ? &d->minor : IS("max_mig") ? &d->max_mig : IS("pci_id") ? &d->pci_id : NULL;
    }
    if (d && !u32) u64 = IS("mem_total") ? &d->mem_total : IS("mem_used") ? &d->mem_used : NULL;
    if (!u32 && !u64) return bad(p ? "unknown proc field" : d->is_mig ? "unknown mig field" : "unknown gpu field", kv);
    if (num(v, u32 ? 0xFFFFFFFFULL : NA - 1, &n)) return -1;
    if (u32) *u32 = (unsigned int)n; else *u64 = n;
    return 0;
}

static int parse_line(scenario_t *s, char *line)
{
    char *rec = token(&line), *kv;
    unsigned long long n;
    if (!rec) return 0;
    if (!strcmp(rec, "init_error") || !strcmp(rec, "cuda") ||
        !strcmp(rec, "driver") || !strcmp(rec, "nvml")) {   /* "<record> <value>" */
        char *v = token(&line);
        if (!v) return bad("missing value", rec);
        if (token(&line)) return bad("unexpected text after value", rec);
        if (!strcmp(rec, "driver")) return str(v, s->driver, sizeof s->driver);
        if (!strcmp(rec, "nvml")) return str(v, s->nvml, sizeof s->nvml);
        if (num(v, 0x7FFFFFFF, &n)) return -1;
        if (rec[0] == 'c') s->cuda = (int)n; else s->init_error = (int)n;
    } else if (!strcmp(rec, "proc")) {
        if (s->nprocs == MAX_PROCS) return bad("too many proc lines", NULL);
        proc_t *p = &s->procs[s->nprocs++];
        *p = (proc_t){ .gi = NO_ID, .ci = NO_ID, .line = g_line };
        while ((kv = token(&line))) if (field(kv, NULL, p)) return -1;
    } else if (!strcmp(rec, "gpu") || !strcmp(rec, "mig")) {
        int mig = rec[0] == 'm';
        if ((mig ? s->nmigs : s->ngpus) == (mig ? MAX_MIGS : MAX_GPUS)) return bad("too many records", rec);
        device_t d = { .is_mig = mig, .defined = 1, .line = g_line, .index = s->ngpus, .arch = 9,
                     .mem_total = 150754820096ULL, .mem_used = NA, .max_mig = 7, .pci_id = 0x233510DE,
                     .minor = NO_ID };
        strcpy(d.name, "NVIDIA H200");
        while ((kv = token(&line))) if (field(kv, &d, NULL)) return -1;
        if (mig) {
            if (!d.uuid[0]) snprintf(d.uuid, STR, "MIG-00000000-0000-0000-0000-%012d", s->nmigs);
            s->migs[s->nmigs++] = d;
            return 0;
        }
        if (d.index >= MAX_GPUS || s->gpus[d.index].defined) return bad("duplicate or too large gpu index", NULL);
        if (!d.uuid[0]) snprintf(d.uuid, STR, "GPU-00000000-0000-0000-0000-%012u", d.index);
        if (!d.bus[0]) snprintf(d.bus, sizeof d.bus, "00000000:%02X:00.0", d.index + 0x10);
        if (d.minor == NO_ID) d.minor = d.index;
        s->gpus[d.index] = d;
        if (d.index >= (unsigned)s->ngpus) s->ngpus = d.index + 1;
    } else {
        return bad("unknown record type", rec);
    }
    return 0;
}

static nvmlReturn_t load(scenario_t *s)
{
    char buf[1024];
    memset(s, 0, sizeof *s);
    strcpy(s->driver, "580.159.04");
    s->cuda = 13000;
    if (!(g_file = getenv("FAKE_NVML_SCENARIO")) || !*g_file) return E_NO_DRIVER;
    FILE *f = fopen(g_file, "r");
    g_line = 0;
    if (!f) { bad("cannot open scenario file", NULL); return E_UNKNOWN; }
    int err = 0;
    while (!err && fgets(buf, sizeof buf, f)) {
        g_line++;
        size_t len = strcspn(buf, "\r\n");
        if (!buf[len] && !feof(f)) { err = bad("line too long", NULL); break; }
        buf[len] = '\0';
        char *hash = strchr(buf, '#');
        if (hash) *hash = '\0';
        err = parse_line(s, buf);
    }
    fclose(f);
    /* Cross-record checks, after all lines are read (records may come in any order). */
    for (int i = 0; !err && i < s->ngpus; i++)
        if (!s->gpus[i].defined) { g_line = 0; err = bad("gpu indexes must be 0..N-1 without gaps", NULL); }
    for (int i = 0; !err && i < s->nmigs; i++)
        if (s->migs[i].gpu >= (unsigned)s->ngpus) { g_line = s->migs[i].line; err = bad("mig refers to an undefined gpu", NULL); }
    for (int i = 0; !err && i < s->nprocs; i++)
        if (s->procs[i].gpu >= (unsigned)s->ngpus) { g_line = s->procs[i].line; err = bad("proc refers to an undefined gpu", NULL); }
    if (err) return E_UNKNOWN;
    if (!s->nvml[0]) snprintf(s->nvml, sizeof s->nvml, "%d.%.60s", s->cuda / 1000, s->driver);
    return s->init_error;
}

/* ------------------------------------------------------------ NVML API */

#define API __attribute__((visibility("default")))
#define NEED_INIT() do { if (!refcount) return E_UNINIT; } while (0)

nvmlReturn_t API nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t r = load(&tmp);
    if (r != OK) return r;
    cur = tmp;
    refcount++;
    return OK;
}
nvmlReturn_t API nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t API nvmlShutdown(void)
{
    NEED_INIT();
    refcount--;
    return OK;
}

const char API *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVALID: return "Invalid Argument";
    case E_NOT_FOUND: return "Not Found";
    case E_SIZE: return "Insufficient Size";
    case E_NO_DRIVER: return "Driver Not Loaded";
    case E_VERSION: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst) return E_INVALID;
    if (strlen(src) >= len) return E_SIZE;
    strcpy(dst, src);
    return OK;
}

nvmlReturn_t API nvmlSystemGetDriverVersion(char *v, unsigned int n) { NEED_INIT(); return copy_str(v, n, cur.driver); }
nvmlReturn_t API nvmlSystemGetNVMLVersion(char *v, unsigned int n) { NEED_INIT(); return copy_str(v, n, cur.nvml); }
nvmlReturn_t API nvmlSystemGetCudaDriverVersion(int *v) { NEED_INIT(); if (!v) return E_INVALID; *v = cur.cuda; return OK; }
nvmlReturn_t API nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }
nvmlReturn_t API nvmlDeviceGetCount_v2(unsigned int *n) { NEED_INIT(); if (!n) return E_INVALID; *n = cur.ngpus; return OK; }

nvmlReturn_t API nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h)
{
    NEED_INIT();
    if (!h || i >= (unsigned)cur.ngpus) return E_INVALID;
    *h = &cur.gpus[i];
    return OK;
}

/* Validate a handle: it must point into the current tables (any device, or physical GPUs only). */
static device_t *any_dev(nvmlDevice_t h)
{
    if (!refcount) return NULL;
    if (h >= cur.gpus && h < cur.gpus + cur.ngpus) return h;
    if (h >= cur.migs && h < cur.migs + cur.nmigs) return h;
    return NULL;
}
static device_t *gpu_dev(nvmlDevice_t h) { device_t *d = any_dev(h); return d && !d->is_mig ? d : NULL; }
static device_t *mig_dev(nvmlDevice_t h) { device_t *d = any_dev(h); return d && d->is_mig ? d : NULL; }

/* One-line getters of an unsigned int field: (handle, unsigned int *out). */
#define UINT_GETTER(fn, lookup, expr)                        \
    nvmlReturn_t API fn(nvmlDevice_t h, unsigned int *out)   \
    {                                                        \
        NEED_INIT();                                         \
        device_t *d = lookup(h);                             \
        if (!d || !out) return E_INVALID;                    \
        *out = (expr);                                       \
        return OK;                                           \
    }
UINT_GETTER(nvmlDeviceGetIndex, gpu_dev, d->index)
UINT_GETTER(nvmlDeviceGetArchitecture, gpu_dev, d->arch)
UINT_GETTER(nvmlDeviceGetComputeMode, gpu_dev, d->compute_mode)
UINT_GETTER(nvmlDeviceGetMinorNumber, gpu_dev, d->minor)
UINT_GETTER(nvmlDeviceGetMaxMigDeviceCount, gpu_dev, d->mig ? d->max_mig : 0) /* 0 when MIG is off, as NVML */
UINT_GETTER(nvmlDeviceIsMigDeviceHandle, any_dev, (unsigned)d->is_mig)
UINT_GETTER(nvmlDeviceGetGpuInstanceId, mig_dev, d->gi)
UINT_GETTER(nvmlDeviceGetComputeInstanceId, mig_dev, d->ci)

nvmlReturn_t API nvmlDeviceGetUUID(nvmlDevice_t h, char *v, unsigned int n)
{ NEED_INIT(); device_t *d = any_dev(h); return d ? copy_str(v, n, d->uuid) : E_INVALID; }
nvmlReturn_t API nvmlDeviceGetName(nvmlDevice_t h, char *v, unsigned int n)
{ NEED_INIT(); device_t *d = any_dev(h); return d ? copy_str(v, n, d->name) : E_INVALID; }

nvmlReturn_t API nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *current, unsigned int *pending)
{
    NEED_INIT();
    device_t *d = gpu_dev(h);
    if (!d || !current || !pending) return E_INVALID;
    *current = d->mig;
    *pending = d->mig_pending;
    return OK;
}

nvmlReturn_t API nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci)
{
    NEED_INIT();
    device_t *d = gpu_dev(h);
    if (!d || !pci) return E_INVALID;
    memset(pci, 0, sizeof *pci);
    strcpy(pci->busId, d->bus);
    /* Legacy field holds the short "dddd:bb:dd.f" form. */
    const char *legacy = strlen(d->bus) > 12 ? d->bus + 4 : d->bus;
    size_t n = strlen(legacy);
    memcpy(pci->busIdLegacy, legacy, n < sizeof pci->busIdLegacy ? n : sizeof pci->busIdLegacy - 1);
    sscanf(d->bus, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = d->pci_id;
    pci->pciSubSystemId = 0x18FF10DE;
    return OK;
}

/* Does process p belong to device d (a whole GPU, or one MIG instance)? */
static int proc_on(const proc_t *p, const device_t *d, int match_ci)
{
    if (!d->is_mig) return p->gpu == d->index;
    return p->gpu == d->gpu && p->gi == d->gi && (!match_ci || p->ci == d->ci);
}

/* Memory used = the explicit mem_used, else the sum over distinct pids of its processes. */
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

nvmlReturn_t API nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m)
{
    NEED_INIT();
    device_t *d = any_dev(h);
    if (!d || !m) return E_INVALID;
    m->total = d->mem_total;
    m->used = used_of(d);
    m->free = m->used < m->total ? m->total - m->used : 0;
    return OK;
}

nvmlReturn_t API nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m)
{
    nvmlMemory_t v1;
    if (m && m->version != nvmlMemory_v2) return refcount ? E_VERSION : E_UNINIT;
    nvmlReturn_t r = nvmlDeviceGetMemoryInfo(h, m ? &v1 : NULL);
    if (r != OK) return r;
    m->total = v1.total; m->reserved = 0; m->free = v1.free; m->used = v1.used;
    return OK;
}

/* The NVML list protocol: with *count too small (e.g. 0 and a NULL array),
 * report the needed count and NVML_ERROR_INSUFFICIENT_SIZE; an empty list is
 * *count = 0 and SUCCESS. On a MIG handle, list that instance's processes. */
static nvmlReturn_t procs(nvmlDevice_t h, unsigned int kind, unsigned int *count, nvmlProcessInfo_t *out)
{
    NEED_INIT();
    device_t *d = any_dev(h);
    unsigned int n = 0, cap;
    if (!d || !count) return E_INVALID;
    cap = *count;
    for (int i = 0; i < cur.nprocs; i++) {
        const proc_t *p = &cur.procs[i];
        if (p->kind != kind || !proc_on(p, d, 1)) continue;
        if (n < cap && out)
            out[n] = (nvmlProcessInfo_t){ p->pid, p->mem, p->gi, p->ci };
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

/* MIG devices of a GPU are its mig lines, in file order; slots up to
 * max_mig without one are NOT_FOUND, as on a partly partitioned GPU. */
nvmlReturn_t API nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t h, unsigned int index, nvmlDevice_t *mig)
{
    NEED_INIT();
    device_t *d = gpu_dev(h);
    unsigned int n = 0;
    if (!d || !mig || !d->mig || index >= d->max_mig) return E_INVALID;
    for (int i = 0; i < cur.nmigs; i++)
        if (cur.migs[i].gpu == d->index && n++ == index) { *mig = &cur.migs[i]; return OK; }
    return E_NOT_FOUND;
}

nvmlReturn_t API nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t h, nvmlDevice_t *gpu)
{
    NEED_INIT();
    device_t *d = mig_dev(h);
    if (!d || !gpu) return E_INVALID;
    *gpu = &cur.gpus[d->gpu];
    return OK;
}
