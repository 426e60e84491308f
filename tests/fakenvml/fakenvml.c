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
 *        mem_used= reserved= bus= pci_id= minor= max_mig= util= mem_util=
 *        sm_clock= mem_clock= video_clock= reasons= temp= power=   (each: a number, or na)
 *   mig  gpu= gi= ci= uuid= name= mem_total= mem_used= reserved=
 *   proc gpu= kind=compute|graphics|mps pid= mem=<bytes>|na gi= ci=
 *        pidns=<inode>[,<inode>...] nspid=<pid>[,<pid>...] sm=<percent>
 * PID namespaces, as the driver: a process list names only the processes of
 * the caller's PID namespace (the inode of /proc/self/ns/pid at nvmlInit).
 * pidns lists the namespaces a process is in, outermost first (the last is
 * its /proc/PID/ns/pid), nspid its pid in each (NSpid of /proc/PID/status;
 * default: pid in all). A caller in one of them sees the process under that
 * namespace's pid; a caller in the initial namespace (inode 0xEFFFFFFC) sees
 * every process under its pid=; any other caller does not see it. A process
 * without pidns is listed to every caller, as given.
 * Memory, as the driver (measured on an H200): nvmlDeviceGetMemoryInfo_v2
 * gives used = the processes' memory (all of them, whatever the caller's
 * namespace; mem_used= overrides the sum) and reserved = the driver's share
 * (reserved=, default 644939776 on a gpu, 0 on a mig); the v1 call counts the
 * reservation in used (v1 used = v2 used + reserved); free = total - both.
 * Utilization: nvmlDeviceGetUtilizationRates gives a gpu's util= and
 * mem_util= (percent, default 0); nvmlDeviceGetProcessUtilization gives one
 * sample per process that has sm= (0 included: an idle process with a
 * context was sampled on the H200), under its pid= (the host pid: samples
 * are not filtered by namespace, as measured), and NVML_ERROR_NOT_FOUND when
 * no process has one. Both are NOT_SUPPORTED in MIG mode (nvidia-smi shows
 * N/A there; not measured on the H200).
 * Clocks, temperature and power (conditions.c), as an idle H200 answered (driver 580.159.04,
 * tests/fixtures/tools-2025.3-h200/nvml-conditions): SM and graphics clock 345 MHz, memory
 * 3201, video 765, clock event reasons 0x1 (GPU idle), 36 C, 78798 mW; a field given as na
 * answers NOT_SUPPORTED, and the fan speed always does (an H200 has no fan of its own).
 * GPM (gpm.c), as the driver on an H200 (tests/fixtures/gpm-h200): a GPU supports it when its
 * arch is Hopper (9) or newer, unless gpm=0|1 says otherwise;
 *   gpm  gpu= id=<metric id> value=<number> return=<nvmlReturn, default 0>
 * is what nvmlGpmMetricsGet answers for that metric between two samples of the GPU; a metric
 * without a gpm line answers NOT_SUPPORTED in its own nvmlReturn.
 * Live state: the calls that answer for "now" re-read the scenario when its file has been
 * replaced (write then rename), so a process can appear while NVML is held open.
 * Not thread-safe around nvmlInit; a test harness does not need that.
 *
 * Memory, process lists and utilization are in processes.c, the types in fakenvml.h.
 * Build: gcc -O2 -Wall -Wextra -shared -fPIC -o libnvidia-ml.so.1 fakenvml.c processes.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fakenvml.h"

scenario_t cur;              /* the scenario in use ... */
static scenario_t tmp;       /* ... and the one nvmlInit parses into, then copies over cur */
int refcount;

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

/* A comma-separated list of at most MAX_NS numbers, each below 2^32. */
static int list(char *v, unsigned int *out, int *n)
{
    unsigned long long x;
    for (*n = 0;; v++) {
        char *comma = strchr(v, ',');
        if (comma) *comma = '\0';
        if (*n == MAX_NS) return bad("more than 32 namespace levels", v);
        if (num(v, 0xFFFFFFFFULL, &x)) return -1;
        out[(*n)++] = (unsigned int)x;
        if (!(v = comma)) return 0;
    }
}

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
        if (IS("pidns")) return list(v, p->pidns, &p->nns);
        if (IS("nspid")) return list(v, p->nspid, &p->nnspid);
        u32 = IS("gpu") ? &p->gpu : IS("pid") ? &p->pid : IS("gi") ? &p->gi : IS("ci") ? &p->ci :
              IS("sm") ? &p->sm : NULL;
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
              IS("minor") ? &d->minor : IS("max_mig") ? &d->max_mig : IS("pci_id") ? &d->pci_id :
              IS("util") ? &d->util : IS("mem_util") ? &d->mem_util : IS("sm_clock") ? &d->sm_clock :
              IS("mem_clock") ? &d->mem_clock : IS("video_clock") ? &d->video_clock : IS("temp") ? &d->temp :
              IS("power") ? &d->power : IS("gpm") ? &d->gpm : NULL;
        int condition = u32 == &d->sm_clock || u32 == &d->mem_clock || u32 == &d->video_clock ||
                        u32 == &d->temp || u32 == &d->power || IS("reasons");
        if (condition && !strcmp(v, "na")) {   /* the driver would say NOT_SUPPORTED */
            if (u32) *u32 = NO_ID; else d->reasons = NA;
            return 0;
        }
    }
    if (d && !u32) u64 = IS("mem_total") ? &d->mem_total : IS("mem_used") ? &d->mem_used :
                         IS("reserved") ? &d->reserved : (IS("reasons") && !d->is_mig) ? &d->reasons : NULL;
    if (!u32 && !u64) return bad(p ? "unknown proc field" : d->is_mig ? "unknown mig field" : "unknown gpu field", kv);
    int percent = (d && (u32 == &d->util || u32 == &d->mem_util)) || (p && u32 == &p->sm);
    if (num(v, percent ? 100 : u32 ? 0xFFFFFFFFULL : NA - 1, &n)) return -1;
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
        *p = (proc_t){ .gi = NO_ID, .ci = NO_ID, .sm = NO_ID, .line = g_line };
        while ((kv = token(&line))) if (field(kv, NULL, p)) return -1;
        if (p->nnspid && p->nnspid != p->nns) return bad("nspid needs one pid per pidns entry", NULL);
        for (int k = p->nnspid; k < p->nns; k++) p->nspid[k] = p->pid;  /* no nspid: pid everywhere */
    } else if (!strcmp(rec, "gpm")) {
        if (s->ngpm == MAX_GPM) return bad("too many gpm lines", NULL);
        gpm_t *m = &s->gpm[s->ngpm++];
        *m = (gpm_t){ .gpu = NO_ID, .id = NO_ID };
        while ((kv = token(&line))) {
            char *v = strchr(kv, '='), *end;
            if (!v) return bad("expected key=value", kv);
            *v++ = '\0';
            if (IS("value")) {
                m->value = strtod(v, &end);
                if (end == v || *end) return bad("not a number", v);
                continue;
            }
            unsigned int *u = IS("gpu") ? &m->gpu : IS("id") ? &m->id : IS("return") ? (unsigned int *)&m->ret : NULL;
            if (!u) return bad("unknown gpm field", kv);
            if (num(v, 0xFFFFFFFEULL, &n)) return -1;
            *u = (unsigned int)n;
        }
        if (m->gpu == NO_ID || m->id == NO_ID) return bad("a gpm line needs gpu= and id=", NULL);
    } else if (!strcmp(rec, "gpu") || !strcmp(rec, "mig")) {
        int mig = rec[0] == 'm';
        if ((mig ? s->nmigs : s->ngpus) == (mig ? MAX_MIGS : MAX_GPUS)) return bad("too many records", rec);
        device_t d = { .is_mig = mig, .defined = 1, .line = g_line, .index = s->ngpus, .arch = 9,
                     .mem_total = 150754820096ULL, .mem_used = NA, .max_mig = 7, .pci_id = 0x233510DE,
                     .minor = NO_ID, .reserved = mig ? 0 : H200_RESERVED,
                     /* an idle H200, as recorded (tests/fixtures/tools-2025.3-h200/nvml-conditions) */
                     .sm_clock = 345, .mem_clock = 3201, .video_clock = 765, .reasons = 0x1, .temp = 36,
                     .power = 78798, .gpm = NO_ID };
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

static struct stat loaded;    /* the scenario file as it was when last read */

static nvmlReturn_t load(scenario_t *s)
{
    char buf[2048];
    struct stat ns;
    memset(s, 0, sizeof *s);
    /* A process cannot leave its PID namespace: the one nvmlInit sees is the caller's. */
    s->caller_ns = stat("/proc/self/ns/pid", &ns) ? 0 : (unsigned int)ns.st_ino;
    strcpy(s->driver, "580.159.04");
    s->cuda = 13000;
    if (!(g_file = getenv("FAKE_NVML_SCENARIO")) || !*g_file) return E_NO_DRIVER;
    FILE *f = fopen(g_file, "r");
    g_line = 0;
    if (!f) { bad("cannot open scenario file", NULL); return E_UNKNOWN; }
    if (fstat(fileno(f), &loaded)) memset(&loaded, 0, sizeof loaded);
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
    for (int i = 0; !err && i < s->ngpm; i++)
        if (s->gpm[i].gpu >= (unsigned)s->ngpus) { g_line = 0; err = bad("gpm refers to an undefined gpu", NULL); }
    if (err) return E_UNKNOWN;
    if (!s->nvml[0]) snprintf(s->nvml, sizeof s->nvml, "%d.%.60s", s->cuda / 1000, s->driver);
    return s->init_error;
}

/* ------------------------------------------------------------ NVML API */

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

void refresh(void)
{
    struct stat now;
    const char *file = getenv("FAKE_NVML_SCENARIO");
    if (!refcount || !file || stat(file, &now)) return;
    if (now.st_ino == loaded.st_ino && now.st_mtim.tv_sec == loaded.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec && now.st_size == loaded.st_size) return;
    /* Only the same GPUs, with new processes, memory and conditions: handles stay valid. */
    if (load(&tmp) == OK && tmp.ngpus == cur.ngpus && tmp.nmigs == cur.nmigs) cur = tmp;
}

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
    case E_NOT_SUPPORTED: return "Not Supported";
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

device_t *any_dev(nvmlDevice_t h)
{
    if (!refcount) return NULL;
    if (h >= cur.gpus && h < cur.gpus + cur.ngpus) return h;
    if (h >= cur.migs && h < cur.migs + cur.nmigs) return h;
    return NULL;
}
device_t *gpu_dev(nvmlDevice_t h) { device_t *d = any_dev(h); return d && !d->is_mig ? d : NULL; }
device_t *mig_dev(nvmlDevice_t h) { device_t *d = any_dev(h); return d && d->is_mig ? d : NULL; }

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
