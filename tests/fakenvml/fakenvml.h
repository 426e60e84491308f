/*
 * fakenvml.h - what the two halves of the stand-in NVML share: the nvml.h
 * types they return, the scenario tables, and the handle checks.
 * fakenvml.c reads the scenario and answers the system and device-attribute
 * calls; processes.c answers memory, process lists and utilization.
 */
#ifndef FAKENVML_H
#define FAKENVML_H

typedef int nvmlReturn_t;
enum { OK = 0, E_UNINIT = 1, E_INVALID = 2, E_NOT_SUPPORTED = 3, E_NOT_FOUND = 6,
       E_SIZE = 7, E_NO_DRIVER = 9, E_VERSION = 25, E_UNKNOWN = 999 };

#define MAX_GPUS 64
#define MAX_MIGS 256
#define MAX_PROCS 1024
#define STR 96                      /* NVML_DEVICE_{UUID,NAME}_V2_BUFFER_SIZE */
#define NA 0xFFFFFFFFFFFFFFFFULL    /* NVML_VALUE_NOT_AVAILABLE (pynvml: None) */
#define NO_ID 0xFFFFFFFFu           /* gi/ci of a process outside MIG */
#define H200_RESERVED 644939776ULL  /* v2 reserved of an H200, driver 580.159.04 */
#define MAX_NS 32                   /* PID namespaces nest 32 deep at most (Linux) */
#define PROC_PID_INIT_INO 0xEFFFFFFCu /* inode of the initial PID namespace */

/* Layouts copied from nvml.h (and pynvml's ctypes mirrors of them). */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 0x02000028u   /* sizeof(nvmlMemory_v2_t) | 2 << 24 */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory;
                 unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long timeStamp;
                 unsigned int smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId,
                 pciSubSystemId; char busId[32]; } nvmlPciInfo_t;

/* A handle (nvmlDevice_t) is a pointer to one of these. */
typedef struct dev {
    int is_mig, defined, line;
    unsigned int index, gpu, gi, ci;   /* gpu: parent index, for MIG devices */
    char uuid[STR], name[STR], bus[32];
    unsigned int arch, mig, mig_pending, compute_mode, minor, max_mig, pci_id;
    unsigned long long mem_total, mem_used; /* mem_used NA: sum of processes */
    unsigned long long reserved;            /* the driver's own share (v2 reserved) */
    unsigned int util, mem_util;            /* utilization rates, percent */
    unsigned int sm_clock, mem_clock, video_clock, temp, power; /* MHz, MHz, MHz, C, mW; NO_ID: not supported */
    unsigned long long reasons;             /* clock event reasons (bits); NA: not supported */
    unsigned int gpm;                       /* GPM support: NO_ID (default) as the driver, by arch */
} device_t;
typedef device_t *nvmlDevice_t;
typedef struct {
    unsigned int gpu, kind, pid, gi, ci;
    unsigned long long mem;
    unsigned int sm;                /* SM percent of its utilization sample; NO_ID: none */
    int line, nns, nnspid;          /* nns 0: no namespace data, listed to every caller */
    unsigned int pidns[MAX_NS];     /* its PID namespaces (inodes), outermost first */
    unsigned int nspid[MAX_NS];     /* its pid in each of them */
} proc_t;

#define MAX_GPM 4096
typedef struct {                    /* one GPM metric's answer for a GPU (gpm.c) */
    unsigned int gpu, id;
    int ret;                        /* its nvmlReturn in nvmlGpmMetricsGet */
    double value;
} gpm_t;

typedef struct {
    int init_error, cuda, ngpus, nmigs, nprocs, ngpm;
    unsigned int caller_ns;         /* the caller's PID namespace (inode), 0 if unknown */
    char driver[80], nvml[80];
    device_t gpus[MAX_GPUS], migs[MAX_MIGS];
    proc_t procs[MAX_PROCS];
    gpm_t gpm[MAX_GPM];
} scenario_t;

/* Exported: the NVML entry points. Hidden: what the two files share, so a
 * same-named symbol of the program that loads the library cannot stand in. */
#define API __attribute__((visibility("default")))
#define SHARED __attribute__((visibility("hidden")))
#define NEED_INIT() do { if (!refcount) return E_UNINIT; } while (0)

extern scenario_t cur SHARED;   /* the scenario read by the last nvmlInit */
extern int refcount SHARED;     /* nvmlInit/nvmlShutdown nest, as in real NVML */

/* Validate a handle: it must point into the current tables (any device, or
 * physical GPUs only, or MIG devices only); NULL if not. */
device_t *any_dev(nvmlDevice_t h) SHARED;
device_t *gpu_dev(nvmlDevice_t h) SHARED;
device_t *mig_dev(nvmlDevice_t h) SHARED;

/* Re-read the scenario if its file was replaced since it was read: the live calls (memory,
 * processes, utilization, clocks, power) answer for "now", as the driver does, so a test can
 * let a process appear while an agent holds NVML open. The device tables keep their places. */
void refresh(void) SHARED;

#endif
