/*
 * A fake libnvidia-ml.so.1 for gpuledger's tests and `gpuledger simulate`.
 *
 * It exports the subset of the NVML C ABI that gpuledger, nvidia-ml-py and Ray call, with
 * the same struct layouts and nvmlReturn_t codes, so the real Python bindings run unchanged
 * against it. Devices come from a plain-text state file named by $GPULEDGER_FAKE_NVML_STATE
 * (format: gpuledger/sim/fake_nvml.py and docs/scenarios.md):
 *
 *   driver <version>
 *   init_error <nvml_return_code>
 *   query_error <nvml_return_code>
 *   hang_ms <milliseconds>
 *   gpu <index> <uuid> <pci_bus_id> <mem_total> <mem_used> <util_gpu> <util_mem> <mig 0|1>
 *       <ok|lost> <name to end of line>
 *   mig <gpu_index> <mig_index> <uuid> <gpu_instance_id> <compute_instance_id>
 *       <gpu_instance_slices> <compute_instance_slices> <mem_total> <mem_used> <profile>
 *   proc <gpu_index> <pid> <used_memory_bytes> [<mig_index>]
 *   topo <gpu_index> <numa_node> <host_bridge> <pcie_switches: a/b/… upstream first, or ->
 *   nvlink <gpu_index> <link> <remote_pci_bus_id> <gpu|npu|switch>
 *   nvlink_error <gpu_index> <nvml_return_code>
 *
 * The file is re-read by every nvmlInit* and nvmlDeviceGetCount* call, so a harness can
 * rewrite it (atomically, by rename) between phases and a long-running exporter sees the
 * change. A missing variable or unreadable file means zero GPUs, and init still succeeds.
 * Lines that do not parse are ignored. init_error only affects nvmlInit*; query_error makes
 * nvmlDeviceGetCount* fail with that code after a successful init (a driver erroring
 * mid-run); hang_ms makes nvmlDeviceGetCount* sleep that long before answering (a hung
 * driver), without holding the library's lock.
 *
 * Handles are pointers into fixed slot arrays (GPUs by index, MIG devices by parent index
 * and MIG device index), so they stay valid across reloads and keep referring to "the GPU at
 * index i" or "MIG device j of GPU i", as real handles do.
 *
 * MIG, as NVML documents it: a `mig` record is a MIG device (one compute instance) of a GPU
 * whose MIG mode is on. nvmlDeviceGetMaxMigDeviceCount is 7 on such a GPU (0 otherwise);
 * nvmlDeviceGetMigDeviceHandleByIndex gives NOT_FOUND for an empty slot. A MIG handle
 * answers UUID, name ("<parent name> MIG <profile>"), index (its MIG device index), GPU and
 * compute instance ids, parent handle, attributes (slice counts, memory), memory and running
 * processes (that instance's); utilization is NOT_SUPPORTED on a MIG handle and on a
 * MIG-enabled GPU, and queries the fake does not model per instance (PCI, power,
 * temperature, MIG mode) answer NOT_SUPPORTED on a MIG handle. A `proc` record with a
 * MIG index runs on that MIG device: the parent GPU's process list (the aggregate a
 * privileged caller gets) carries its gpuInstanceId/computeInstanceId, and the MIG handle
 * lists it.
 *
 * Topology, as nvml.h documents it: nvmlDeviceGetTopologyCommonAncestor answers from the
 * two GPUs' `topo` records (SYSTEM across NUMA nodes, NODE across host bridges of one NUMA
 * node, HOSTBRIDGE when no PCIe switch is shared, SINGLE behind the same last switch,
 * MULTIPLE through several), NOT_SUPPORTED when either GPU has none (a platform NVML cannot
 * read), INVALID_ARGUMENT for a GPU with itself. A GPU without `nvlink` records has no
 * NVLink: nvmlDeviceGetNvLinkState is NOT_SUPPORTED, as on PCIe-only boards. With records
 * it has FAKE_NVLINKS links (an H100 SXM's 18): a recorded link is active and its
 * nvmlDeviceGetNvLinkRemotePciInfo_v2 / nvmlDeviceGetNvLinkRemoteDeviceType name the far
 * end; the others are inactive (state 0, and NOT_SUPPORTED for their far end); a link past
 * the count is INVALID_ARGUMENT. `nvlink_error` makes every NVLink query of that GPU fail
 * with that code (a driver erroring). Link queries on a lost GPU answer GPU_IS_LOST.
 *
 * Build variants (to exercise pynvml's fallbacks against older drivers):
 *   -DFAKE_NVML_NO_V3         omit nvmlDeviceGetComputeRunningProcesses_v3
 *   -DFAKE_NVML_NO_MEMORY_V2  omit nvmlDeviceGetMemoryInfo_v2
 *   -DFAKE_NVML_NO_NVLINK_TYPE omit nvmlDeviceGetNvLinkRemoteDeviceType
 *
 * Build with -fvisibility=hidden: only NVML_EXPORT symbols are public, and exported
 * functions call static implementations only, so two copies loaded in one process (one per
 * variant) never bind to each other's symbols.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NVML_EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

#define STATE_ENV "GPULEDGER_FAKE_NVML_STATE"
#define DEFAULT_DRIVER "550.54.15"
#define CUDA_DRIVER_VERSION 12040
#define MAX_GPUS 64
#define MAX_PROCS 4096
#define MAX_MIG 7 /* MIG devices per GPU: A100, H100 and H200 have at most seven */
#define PROFILE_LEN 32
#define NO_MIG 0xFFFFFFFFu /* a process record outside any MIG device */
#define MIB (1024ull * 1024ull)
/* Buffer sizes match nvml.h (the *_V2_BUFFER_SIZE values pynvml passes). */
#define NAME_LEN 96
#define UUID_LEN 96
#define BUS_ID_LEN 32
#define BUS_ID_LEGACY_LEN 16
#define DRIVER_LEN 80
#define PCI_DEVICE_ID 0x233010DEu    /* H100 SXM5 */
#define PCI_SUBSYSTEM_ID 0x16C110DEu
#define NOT_IN_INSTANCE 0xFFFFFFFFu  /* gpu/compute instance id outside MIG */
#define MEMORY_V2_VERSION 0x02000028u /* nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24 */
#define FAKE_NVLINKS 18 /* NVLinks of an H100 SXM (NVML_NVLINK_MAX_LINKS is 36) */
#define SWITCH_PATH_LEN 64
/* nvmlGpuTopologyLevel_t and nvmlIntNvLinkDeviceType_t (nvml.h). */
enum {
    TOPOLOGY_INTERNAL = 0,
    TOPOLOGY_SINGLE = 10,
    TOPOLOGY_MULTIPLE = 20,
    TOPOLOGY_HOSTBRIDGE = 30,
    TOPOLOGY_NODE = 40,
    TOPOLOGY_SYSTEM = 50,
};
enum { NVLINK_DEVICE_GPU = 0, NVLINK_DEVICE_IBMNPU = 1, NVLINK_DEVICE_SWITCH = 2 };

/* ---- ABI structs (layouts from nvml.h / pynvml) ---- */

typedef struct {
    char busIdLegacy[BUS_ID_LEGACY_LEN];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[BUS_ID_LEN];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* v2 and v3 share this layout */

/* ---- simulated state ---- */

struct fake_gpu {
    int present;
    unsigned int index;
    char uuid[UUID_LEN];
    char name[NAME_LEN];
    char bus_id[BUS_ID_LEN];
    char bus_id_legacy[BUS_ID_LEGACY_LEN];
    unsigned int domain, bus, device, function;
    unsigned long long mem_total, mem_used;
    unsigned int util_gpu, util_mem;
    int mig;
    int lost;
};

/* A MIG device: one compute instance inside one GPU instance of its parent GPU. */
struct fake_mig {
    int present;
    unsigned int gpu;   /* the parent's index */
    unsigned int index; /* MIG device index under the parent */
    char uuid[UUID_LEN];
    char name[NAME_LEN];
    char profile[PROFILE_LEN];
    unsigned int gi, ci;               /* GPU instance id, compute instance id */
    unsigned int gi_slices, ci_slices; /* the profile's slice counts */
    unsigned long long mem_total, mem_used;
};

struct fake_proc {
    unsigned int gpu;
    unsigned int pid;
    unsigned long long used;
    unsigned int mig; /* MIG device index, or NO_MIG */
};

/* Where a GPU sits (a `topo` record) and its NVLinks (`nvlink` records). Kept apart from
 * fake_gpu: the records may come before their GPU's line. */
struct fake_link {
    int active;
    unsigned int domain, bus, device, type;
    char bus_id[BUS_ID_LEN];
    char bus_id_legacy[BUS_ID_LEGACY_LEN];
};

struct fake_topo {
    int placed; /* a topo record was read */
    unsigned int numa, bridge;
    char switches[SWITCH_PATH_LEN]; /* "a/b", upstream first; "" for none */
    int has_nvlink;
    nvmlReturn_t nvlink_error;
    struct fake_link links[FAKE_NVLINKS];
};

struct fake_state {
    char driver[DRIVER_LEN];
    nvmlReturn_t init_error;
    nvmlReturn_t query_error;
    unsigned int hang_ms;
    unsigned int gpu_count; /* highest present index + 1 */
    struct fake_gpu gpus[MAX_GPUS];
    struct fake_mig migs[MAX_GPUS][MAX_MIG];
    unsigned int nprocs;
    struct fake_proc procs[MAX_PROCS];
    struct fake_topo topo[MAX_GPUS];
};

/* Opaque to callers: a pointer into g_state.gpus or g_state.migs (see resolve_locked). */
typedef void *nvmlDevice_t;

/* One lock for reloads and reads: a reload rewrites the slots other threads read. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_state g_state;
static unsigned int g_init_count; /* nvmlInit/nvmlShutdown are reference counted */

/* ---- parsing ---- */

static int parse_u64(const char *s, unsigned long long *out) {
    if (s == NULL || *s == '\0') return 0;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0; /* strtoull would accept "-1", " 1", "0x" */
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == NULL || *end != '\0') return 0;
    *out = v;
    return 1;
}

static int parse_u32(const char *s, unsigned int *out) {
    unsigned long long v;
    if (!parse_u64(s, &v) || v > 0xFFFFFFFFull) return 0;
    *out = (unsigned int)v;
    return 1;
}

static int parse_hex(const char *s, size_t len, size_t max_len, unsigned int *out) {
    if (len == 0 || len > max_len) return 0;
    unsigned int v = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (!isxdigit(c)) return 0;
        v = v * 16u + (unsigned int)(isdigit(c) ? c - '0' : tolower(c) - 'a' + 10);
    }
    *out = v;
    return 1;
}

/* Accepts "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F", "BB:DD.F", with or without ".F", like NVML. */
static int parse_bus_id(const char *s, unsigned int *domain, unsigned int *bus,
                        unsigned int *device, unsigned int *function) {
    const char *c1 = strchr(s, ':');
    if (c1 == NULL) return 0;
    const char *c2 = strchr(c1 + 1, ':');
    const char *bus_start = s;
    *domain = 0;
    if (c2 != NULL) {
        if (!parse_hex(s, (size_t)(c1 - s), 8, domain)) return 0;
        bus_start = c1 + 1;
        c1 = c2;
    }
    if (!parse_hex(bus_start, (size_t)(c1 - bus_start), 2, bus)) return 0;
    const char *dev_start = c1 + 1;
    const char *dot = strchr(dev_start, '.');
    *function = 0;
    if (dot != NULL) {
        if (!parse_hex(dot + 1, strlen(dot + 1), 1, function) || *function > 7) return 0;
        return parse_hex(dev_start, (size_t)(dot - dev_start), 2, device) && *device < 32;
    }
    return parse_hex(dev_start, strlen(dev_start), 2, device) && *device < 32;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Splits off the next whitespace-delimited token in place; NULL when none is left. */
static char *next_token(char **cursor) {
    char *p = *cursor;
    while (*p && is_blank(*p)) p++;
    if (*p == '\0') {
        *cursor = p;
        return NULL;
    }
    char *start = p;
    while (*p && !is_blank(*p)) p++;
    if (*p) *p++ = '\0';
    *cursor = p;
    return start;
}

static int copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n == 0 || n >= cap) return 0;
    memcpy(dst, src, n + 1);
    return 1;
}

static void parse_gpu(char *rest) {
    char *tok[9];
    for (int i = 0; i < 9; i++)
        if ((tok[i] = next_token(&rest)) == NULL) return;
    /* The name is the rest of the line, trimmed: it may contain spaces. */
    while (*rest && is_blank(*rest)) rest++;
    size_t n = strlen(rest);
    while (n > 0 && is_blank(rest[n - 1])) rest[--n] = '\0';

    struct fake_gpu g;
    memset(&g, 0, sizeof g);
    unsigned int mig;
    if (!parse_u32(tok[0], &g.index) || g.index >= MAX_GPUS) return;
    if (!copy_str(g.uuid, sizeof g.uuid, tok[1])) return;
    if (strlen(tok[2]) >= BUS_ID_LEN) return;
    if (!parse_bus_id(tok[2], &g.domain, &g.bus, &g.device, &g.function)) return;
    if (!parse_u64(tok[3], &g.mem_total) || !parse_u64(tok[4], &g.mem_used)) return;
    if (!parse_u32(tok[5], &g.util_gpu) || !parse_u32(tok[6], &g.util_mem)) return;
    if (!parse_u32(tok[7], &mig) || mig > 1) return;
    if (strcmp(tok[8], "ok") == 0)
        g.lost = 0;
    else if (strcmp(tok[8], "lost") == 0)
        g.lost = 1;
    else
        return;
    if (!copy_str(g.name, sizeof g.name, rest)) return;
    g.mig = (int)mig;
    /* Report the bus id the way NVML formats it, whatever spelling the file used. */
    snprintf(g.bus_id, sizeof g.bus_id, "%08X:%02X:%02X.%X", g.domain, g.bus, g.device,
             g.function);
    snprintf(g.bus_id_legacy, sizeof g.bus_id_legacy, "%04X:%02X:%02X.%X", g.domain & 0xFFFFu,
             g.bus, g.device, g.function);
    g.present = 1;
    g_state.gpus[g.index] = g; /* a repeated index: the last line wins */
}

static void parse_mig(char *rest) {
    char *tok[10];
    for (int i = 0; i < 10; i++)
        if ((tok[i] = next_token(&rest)) == NULL) return;
    if (next_token(&rest) != NULL) return;
    struct fake_mig m;
    memset(&m, 0, sizeof m);
    if (!parse_u32(tok[0], &m.gpu) || m.gpu >= MAX_GPUS) return;
    if (!parse_u32(tok[1], &m.index) || m.index >= MAX_MIG) return;
    if (!copy_str(m.uuid, sizeof m.uuid, tok[2])) return;
    if (!parse_u32(tok[3], &m.gi) || !parse_u32(tok[4], &m.ci)) return;
    if (!parse_u32(tok[5], &m.gi_slices) || !parse_u32(tok[6], &m.ci_slices)) return;
    if (!parse_u64(tok[7], &m.mem_total) || !parse_u64(tok[8], &m.mem_used)) return;
    if (!copy_str(m.profile, sizeof m.profile, tok[9])) return;
    m.present = 1;
    g_state.migs[m.gpu][m.index] = m; /* a repeated slot: the last line wins */
}

static void parse_proc(char *rest) {
    char *t_gpu = next_token(&rest), *t_pid = next_token(&rest), *t_mem = next_token(&rest);
    char *t_mig = next_token(&rest);
    if (t_mem == NULL || next_token(&rest) != NULL) return;
    struct fake_proc p;
    if (!parse_u32(t_gpu, &p.gpu) || p.gpu >= MAX_GPUS) return;
    if (!parse_u32(t_pid, &p.pid) || !parse_u64(t_mem, &p.used)) return;
    p.mig = NO_MIG;
    if (t_mig != NULL && (!parse_u32(t_mig, &p.mig) || p.mig >= MAX_MIG)) return;
    if (g_state.nprocs >= MAX_PROCS) return;
    g_state.procs[g_state.nprocs++] = p;
}

static void parse_topo(char *rest) {
    char *t_gpu = next_token(&rest), *t_numa = next_token(&rest), *t_bridge = next_token(&rest);
    char *t_switches = next_token(&rest);
    if (t_switches == NULL || next_token(&rest) != NULL) return;
    unsigned int gpu, numa, bridge;
    if (!parse_u32(t_gpu, &gpu) || gpu >= MAX_GPUS) return;
    if (!parse_u32(t_numa, &numa) || !parse_u32(t_bridge, &bridge)) return;
    struct fake_topo *t = &g_state.topo[gpu];
    if (strcmp(t_switches, "-") == 0)
        t->switches[0] = '\0';
    else if (!copy_str(t->switches, sizeof t->switches, t_switches))
        return;
    t->numa = numa;
    t->bridge = bridge;
    t->placed = 1;
}

static void parse_nvlink(char *rest) {
    char *t_gpu = next_token(&rest), *t_link = next_token(&rest), *t_bus = next_token(&rest);
    char *t_type = next_token(&rest);
    if (t_type == NULL || next_token(&rest) != NULL) return;
    unsigned int gpu, link, function;
    struct fake_link l;
    memset(&l, 0, sizeof l);
    if (!parse_u32(t_gpu, &gpu) || gpu >= MAX_GPUS) return;
    if (!parse_u32(t_link, &link) || link >= FAKE_NVLINKS) return;
    if (strlen(t_bus) >= BUS_ID_LEN) return;
    if (!parse_bus_id(t_bus, &l.domain, &l.bus, &l.device, &function)) return;
    if (strcmp(t_type, "gpu") == 0)
        l.type = NVLINK_DEVICE_GPU;
    else if (strcmp(t_type, "npu") == 0)
        l.type = NVLINK_DEVICE_IBMNPU;
    else if (strcmp(t_type, "switch") == 0)
        l.type = NVLINK_DEVICE_SWITCH;
    else
        return;
    snprintf(l.bus_id, sizeof l.bus_id, "%08X:%02X:%02X.%X", l.domain, l.bus, l.device, function);
    snprintf(l.bus_id_legacy, sizeof l.bus_id_legacy, "%04X:%02X:%02X.%X", l.domain & 0xFFFFu,
             l.bus, l.device, function);
    l.active = 1;
    g_state.topo[gpu].links[link] = l;
    g_state.topo[gpu].has_nvlink = 1;
}

static void parse_nvlink_error(char *rest) {
    char *t_gpu = next_token(&rest), *t_code = next_token(&rest);
    unsigned int gpu, code;
    if (t_code == NULL || next_token(&rest) != NULL) return;
    if (!parse_u32(t_gpu, &gpu) || gpu >= MAX_GPUS) return;
    if (!parse_u32(t_code, &code) || code == 0 || code > 0x7FFFFFFFu) return;
    g_state.topo[gpu].nvlink_error = (nvmlReturn_t)code;
}

static void parse_line(char *line) {
    char *rest = line;
    char *kw = next_token(&rest);
    if (kw == NULL || kw[0] == '#') return;
    if (strcmp(kw, "gpu") == 0) {
        parse_gpu(rest);
    } else if (strcmp(kw, "proc") == 0) {
        parse_proc(rest);
    } else if (strcmp(kw, "mig") == 0) {
        parse_mig(rest);
    } else if (strcmp(kw, "topo") == 0) {
        parse_topo(rest);
    } else if (strcmp(kw, "nvlink") == 0) {
        parse_nvlink(rest);
    } else if (strcmp(kw, "nvlink_error") == 0) {
        parse_nvlink_error(rest);
    } else if (strcmp(kw, "driver") == 0) {
        char *v = next_token(&rest);
        if (v != NULL && next_token(&rest) == NULL)
            copy_str(g_state.driver, sizeof g_state.driver, v);
    } else if (strcmp(kw, "init_error") == 0) {
        char *v = next_token(&rest);
        unsigned int code;
        if (v != NULL && next_token(&rest) == NULL && parse_u32(v, &code) && code <= 0x7FFFFFFFu)
            g_state.init_error = (nvmlReturn_t)code;
    } else if (strcmp(kw, "query_error") == 0) {
        char *v = next_token(&rest);
        unsigned int code;
        if (v != NULL && next_token(&rest) == NULL && parse_u32(v, &code) && code <= 0x7FFFFFFFu)
            g_state.query_error = (nvmlReturn_t)code;
    } else if (strcmp(kw, "hang_ms") == 0) {
        char *v = next_token(&rest);
        unsigned int ms;
        if (v != NULL && next_token(&rest) == NULL && parse_u32(v, &ms) && ms <= 600000u)
            g_state.hang_ms = ms;
    }
}

/* MIG devices exist only under a present GPU in MIG mode; NVML names them after it. */
static void settle_migs_locked(void) {
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        const struct fake_gpu *g = &g_state.gpus[i];
        for (unsigned int j = 0; j < MAX_MIG; j++) {
            struct fake_mig *m = &g_state.migs[i][j];
            if (!m->present) continue;
            if (!g->present || !g->mig) {
                m->present = 0;
                continue;
            }
            int n = snprintf(m->name, sizeof m->name, "%s MIG %s", g->name, m->profile);
            if (n < 0 || (size_t)n >= sizeof m->name) m->present = 0; /* would not fit */
        }
    }
}

/* Caller holds g_lock. getenv on every reload: the harness may repoint the variable. */
static void reload_locked(void) {
    memset(&g_state, 0, sizeof g_state);
    memcpy(g_state.driver, DEFAULT_DRIVER, sizeof DEFAULT_DRIVER);
    const char *path = getenv(STATE_ENV);
    if (path == NULL || *path == '\0') return;
    FILE *f = fopen(path, "re");
    if (f == NULL) return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) != -1) parse_line(line);
    free(line);
    fclose(f);
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        if (g_state.gpus[i].present) g_state.gpu_count = i + 1;
    settle_migs_locked();
}

/* ---- helpers shared by the entry points ---- */

static nvmlReturn_t unlock_with(nvmlReturn_t rc) {
    pthread_mutex_unlock(&g_lock);
    return rc;
}

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src) {
    size_t n = strlen(src);
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if ((size_t)length < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* The slot a handle points at: a GPU (*mig NULL) or a MIG device and its parent. Caller
 * holds g_lock. A handle to an empty slot, or to a MIG device whose parent left MIG mode,
 * is invalid. */
static nvmlReturn_t resolve_locked(nvmlDevice_t device, struct fake_gpu **gpu,
                                   struct fake_mig **mig) {
    uintptr_t p = (uintptr_t)device;
    uintptr_t gpus = (uintptr_t)g_state.gpus, migs = (uintptr_t)g_state.migs;
    if (p >= gpus && p < gpus + sizeof g_state.gpus) {
        if ((p - gpus) % sizeof(struct fake_gpu) != 0) return NVML_ERROR_INVALID_ARGUMENT;
        *gpu = (struct fake_gpu *)device;
        *mig = NULL;
        return (*gpu)->present ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    }
    if (p >= migs && p < migs + sizeof g_state.migs) {
        if ((p - migs) % sizeof(struct fake_mig) != 0) return NVML_ERROR_INVALID_ARGUMENT;
        *mig = (struct fake_mig *)device;
        if (!(*mig)->present) return NVML_ERROR_INVALID_ARGUMENT;
        *gpu = &g_state.gpus[(*mig)->gpu];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/*
 * Locks, then validates a GPU or MIG handle. On success returns with g_lock held, *gpu set
 * (for a MIG handle: its parent) and *mig set (NULL for a GPU handle); the caller must
 * release it via unlock_with(). On failure the lock is already released.
 * need_alive: the query needs the GPU on the bus (a lost GPU, and its MIG devices, answer
 * GPU_IS_LOST).
 */
static nvmlReturn_t enter_any(nvmlDevice_t device, struct fake_gpu **gpu, struct fake_mig **mig,
                              int need_alive) {
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) return unlock_with(NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t rc = resolve_locked(device, gpu, mig);
    if (rc != NVML_SUCCESS) return unlock_with(rc);
    if (need_alive && (*gpu)->lost) return unlock_with(NVML_ERROR_GPU_IS_LOST);
    return NVML_SUCCESS;
}

/* enter_any for queries the fake answers per GPU only: a MIG handle is NOT_SUPPORTED. */
static nvmlReturn_t enter_device(nvmlDevice_t device, struct fake_gpu **gpu, int need_alive) {
    struct fake_mig *mig;
    nvmlReturn_t rc = enter_any(device, gpu, &mig, need_alive);
    if (rc != NVML_SUCCESS) return rc;
    if (mig != NULL) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

static nvmlReturn_t enter_system(void) {
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) return unlock_with(NVML_ERROR_UNINITIALIZED);
    return NVML_SUCCESS;
}

/* ---- init / system ---- */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_lock);
    reload_locked();
    if (g_state.init_error != NVML_SUCCESS) return unlock_with(g_state.init_error);
    g_init_count++;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
NVML_EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing here: zero GPUs never fails init */
    return do_init();
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) return unlock_with(NVML_ERROR_UNINITIALIZED);
    g_init_count--;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS) return rc;
    return unlock_with(copy_out(version, length, g_state.driver));
}

/* Like the real library, works without nvmlInit: "<CUDA major>.<driver version>". */
NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char buf[DRIVER_LEN + 8];
    pthread_mutex_lock(&g_lock);
    snprintf(buf, sizeof buf, "%d.%s", CUDA_DRIVER_VERSION / 1000,
             g_state.driver[0] ? g_state.driver : DEFAULT_DRIVER);
    return unlock_with(copy_out(version, length, buf));
}

static nvmlReturn_t cuda_driver_version(int *version) {
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS) return rc;
    if (version == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *version = CUDA_DRIVER_VERSION;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_driver_version(v); }
NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return cuda_driver_version(v);
}

/* ---- enumeration ---- */

static nvmlReturn_t device_count(unsigned int *count) {
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS) return rc;
    if (count == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    reload_locked(); /* the harness's phase changes become visible here */
    unsigned int hang_ms = g_state.hang_ms;
    nvmlReturn_t error = g_state.query_error;
    unsigned int gpus = g_state.gpu_count;
    pthread_mutex_unlock(&g_lock);
    if (hang_ms > 0) { /* a hung driver: the caller waits, other threads do not */
        struct timespec pause = {(time_t)(hang_ms / 1000u), (long)(hang_ms % 1000u) * 1000000L};
        while (nanosleep(&pause, &pause) == -1 && errno == EINTR) {
        }
    }
    if (error != NVML_SUCCESS) return error;
    *count = gpus;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return device_count(count); }
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return device_count(count); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS) return rc;
    if (device == NULL || index >= MAX_GPUS || !g_state.gpus[index].present)
        return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_state.gpus[index];
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS) return rc;
    if (uuid == NULL || device == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        if (g_state.gpus[i].present && strcmp(g_state.gpus[i].uuid, uuid) == 0) {
            *device = &g_state.gpus[i];
            return unlock_with(NVML_SUCCESS);
        }
        for (unsigned int j = 0; j < MAX_MIG; j++) { /* a MIG UUID gives its MIG handle */
            if (g_state.migs[i][j].present && strcmp(g_state.migs[i][j].uuid, uuid) == 0) {
                *device = &g_state.migs[i][j];
                return unlock_with(NVML_SUCCESS);
            }
        }
    }
    return unlock_with(NVML_ERROR_NOT_FOUND);
}

static nvmlReturn_t handle_by_bus_id(const char *bus_id, nvmlDevice_t *device) {
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS) return rc;
    unsigned int domain, bus, dev, function;
    if (bus_id == NULL || device == NULL || !parse_bus_id(bus_id, &domain, &bus, &dev, &function))
        return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        struct fake_gpu *g = &g_state.gpus[i];
        if (g->present && g->domain == domain && g->bus == bus && g->device == dev &&
            g->function == function) {
            *device = g;
            return unlock_with(NVML_SUCCESS);
        }
    }
    return unlock_with(NVML_ERROR_NOT_FOUND);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *device) {
    return handle_by_bus_id(id, device);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *device) {
    return handle_by_bus_id(id, device);
}

/* ---- static identity: answered even for a lost GPU (the driver caches it) ---- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct fake_gpu *g;
    struct fake_mig *m;
    nvmlReturn_t rc = enter_any(device, &g, &m, 0);
    if (rc != NVML_SUCCESS) return rc;
    return unlock_with(copy_out(uuid, length, m != NULL ? m->uuid : g->uuid));
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct fake_gpu *g;
    struct fake_mig *m;
    nvmlReturn_t rc = enter_any(device, &g, &m, 0);
    if (rc != NVML_SUCCESS) return rc;
    return unlock_with(copy_out(name, length, m != NULL ? m->name : g->name));
}

/* On a MIG handle: its MIG device index, which nvmlDeviceGetMigDeviceHandleByIndex takes. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    struct fake_gpu *g;
    struct fake_mig *m;
    nvmlReturn_t rc = enter_any(device, &g, &m, 0);
    if (rc != NVML_SUCCESS) return rc;
    if (index == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *index = m != NULL ? m->index : g->index;
    return unlock_with(NVML_SUCCESS);
}

/* /dev/nvidia<minor>: the fake numbers them like a typical host, minor == index. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 0);
    if (rc != NVML_SUCCESS) return rc;
    if (minor == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *minor = g->index;
    return unlock_with(NVML_SUCCESS);
}

static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 0);
    if (rc != NVML_SUCCESS) return rc;
    if (pci == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busIdLegacy, g->bus_id_legacy, sizeof pci->busIdLegacy);
    memcpy(pci->busId, g->bus_id, sizeof pci->busId);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = PCI_DEVICE_ID;
    pci->pciSubSystemId = PCI_SUBSYSTEM_ID;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(device, pci);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(device, pci);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(device, pci);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                            int *minor) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 0);
    if (rc != NVML_SUCCESS) return rc;
    if (major == NULL || minor == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *major = 9;
    *minor = 0;
    return unlock_with(NVML_SUCCESS);
}

/* ---- live queries: a lost GPU answers GPU_IS_LOST ---- */

/* A GPU's memory, or a MIG device's (its GPU instance's share). */
static void memory_of(const struct fake_gpu *g, const struct fake_mig *m,
                      unsigned long long *total, unsigned long long *used) {
    *total = m != NULL ? m->mem_total : g->mem_total;
    *used = m != NULL ? m->mem_used : g->mem_used;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct fake_gpu *g;
    struct fake_mig *m;
    nvmlReturn_t rc = enter_any(device, &g, &m, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (memory == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total, used;
    memory_of(g, m, &total, &used);
    memory->total = total;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return unlock_with(NVML_SUCCESS);
}

#ifndef FAKE_NVML_NO_MEMORY_V2
/* reserved is reported as 0, so v1 and v2 agree on used and free. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    struct fake_gpu *g;
    struct fake_mig *m;
    nvmlReturn_t rc = enter_any(device, &g, &m, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (memory == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != MEMORY_V2_VERSION)
        return unlock_with(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, used;
    memory_of(g, m, &total, &used);
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return unlock_with(NVML_SUCCESS);
}
#endif

/* NVML has no utilization for a MIG device, nor for a GPU in MIG mode. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                       nvmlUtilization_t *utilization) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (utilization == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    if (g->mig) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = g->util_gpu;
    utilization->memory = g->util_mem;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                              unsigned int *pending) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (current == NULL || pending == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *current = (unsigned int)g->mig;
    *pending = (unsigned int)g->mig;
    return unlock_with(NVML_SUCCESS);
}

/* How many MIG devices can exist under the GPU: 0 when MIG mode is off. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (count == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *count = g->mig ? MAX_MIG : 0;
    return unlock_with(NVML_SUCCESS);
}

/* Slots may be empty (MIG device indices need not be dense): NOT_FOUND there. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device,
                                                             unsigned int index,
                                                             nvmlDevice_t *mig) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (mig == NULL || index >= MAX_MIG) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    struct fake_mig *m = &g_state.migs[g->index][index];
    if (!g->mig || !m->present) return unlock_with(NVML_ERROR_NOT_FOUND);
    *mig = m;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    struct fake_gpu *g;
    struct fake_mig *m;
    nvmlReturn_t rc = enter_any(device, &g, &m, 0);
    if (rc != NVML_SUCCESS) return rc;
    if (is_mig == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = m != NULL;
    return unlock_with(NVML_SUCCESS);
}

/* Queries that only a MIG handle answers: a GPU handle is NOT_SUPPORTED. */
static nvmlReturn_t enter_mig(nvmlDevice_t device, struct fake_mig **mig, void *out) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_any(device, &g, mig, 0);
    if (rc != NVML_SUCCESS) return rc;
    if (out == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    if (*mig == NULL) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    struct fake_mig *m;
    nvmlReturn_t rc = enter_mig(device, &m, id);
    if (rc != NVML_SUCCESS) return rc;
    *id = m->gi;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    struct fake_mig *m;
    nvmlReturn_t rc = enter_mig(device, &m, id);
    if (rc != NVML_SUCCESS) return rc;
    *id = m->ci;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig_device,
                                                                      nvmlDevice_t *device) {
    struct fake_mig *m;
    nvmlReturn_t rc = enter_mig(mig_device, &m, device);
    if (rc != NVML_SUCCESS) return rc;
    *device = &g_state.gpus[m->gpu];
    return unlock_with(NVML_SUCCESS);
}

/* SMs per compute slice count, as on an H100 SXM (132 SMs whole). */
static unsigned int multiprocessors(unsigned int ci_slices) {
    switch (ci_slices) {
    case 1: return 16;
    case 2: return 32;
    case 3: return 60;
    case 4: return 64;
    case 7: return 132;
    default: return 16u * ci_slices;
    }
}

/* A MIG device's profile: what nvidia-smi and the device plugin derive its name from. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                    nvmlDeviceAttributes_t *attributes) {
    struct fake_mig *m;
    nvmlReturn_t rc = enter_mig(device, &m, attributes);
    if (rc != NVML_SUCCESS) return rc;
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = multiprocessors(m->ci_slices);
    attributes->gpuInstanceSliceCount = m->gi_slices;
    attributes->computeInstanceSliceCount = m->ci_slices;
    attributes->memorySizeMB = m->mem_total / MIB;
    return unlock_with(NVML_SUCCESS);
}

/* Plausible H100 numbers that follow utilization, so dashboards show movement. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (milliwatts == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int util = g->util_gpu > 100 ? 100 : g->util_gpu;
    *milliwatts = 70000u + util * 6000u;
    return unlock_with(NVML_SUCCESS);
}

static nvmlReturn_t power_limit(nvmlDevice_t device, unsigned int *milliwatts) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (milliwatts == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *milliwatts = 700000u;
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *mw) {
    return power_limit(device, mw);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *mw) {
    return power_limit(device, mw);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor,
                                                  unsigned int *celsius) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (sensor != 0 /* NVML_TEMPERATURE_GPU */ || celsius == NULL)
        return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int util = g->util_gpu > 100 ? 100 : g->util_gpu;
    *celsius = 32u + util / 3u;
    return unlock_with(NVML_SUCCESS);
}

/*
 * Running processes, with NVML's size protocol: *count in = array capacity, out = number of
 * processes. A NULL array or too small a capacity gives INSUFFICIENT_SIZE and the needed
 * count, except that no processes with capacity 0 is plain SUCCESS (pynvml relies on it).
 */
enum proc_layout { LAYOUT_V1, LAYOUT_V2 };

/* Whether the handle lists the process: a GPU handle all of the GPU's (the aggregate), a
 * MIG handle those on its MIG device. */
static int lists(const struct fake_gpu *g, const struct fake_mig *m, const struct fake_proc *p) {
    if (p->gpu != g->index) return 0;
    return m == NULL || p->mig == m->index;
}

/* The process's GPU and compute instance, from the MIG device it runs on. */
static void instance_of(const struct fake_proc *p, unsigned int *gi, unsigned int *ci) {
    const struct fake_mig *m = p->mig < MAX_MIG ? &g_state.migs[p->gpu][p->mig] : NULL;
    *gi = m != NULL && m->present ? m->gi : NOT_IN_INSTANCE;
    *ci = m != NULL && m->present ? m->ci : NOT_IN_INSTANCE;
}

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count, void *infos,
                                      enum proc_layout layout, int graphics) {
    struct fake_gpu *g;
    struct fake_mig *m;
    nvmlReturn_t rc = enter_any(device, &g, &m, 1);
    if (rc != NVML_SUCCESS) return rc;
    if (count == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int needed = 0;
    if (!graphics)
        for (unsigned int i = 0; i < g_state.nprocs; i++)
            if (lists(g, m, &g_state.procs[i])) needed++;
    unsigned int capacity = *count;
    *count = needed;
    if (needed == 0) return unlock_with(NVML_SUCCESS);
    if (infos == NULL || capacity < needed) return unlock_with(NVML_ERROR_INSUFFICIENT_SIZE);
    unsigned int out = 0;
    for (unsigned int i = 0; i < g_state.nprocs; i++) {
        const struct fake_proc *p = &g_state.procs[i];
        if (!lists(g, m, p)) continue;
        if (layout == LAYOUT_V1) {
            nvmlProcessInfo_v1_t *dst = (nvmlProcessInfo_v1_t *)infos + out;
            memset(dst, 0, sizeof *dst);
            dst->pid = p->pid;
            dst->usedGpuMemory = p->used;
        } else {
            nvmlProcessInfo_t *dst = (nvmlProcessInfo_t *)infos + out;
            memset(dst, 0, sizeof *dst);
            dst->pid = p->pid;
            dst->usedGpuMemory = p->used;
            instance_of(p, &dst->gpuInstanceId, &dst->computeInstanceId);
        }
        out++;
    }
    return unlock_with(NVML_SUCCESS);
}

#ifndef FAKE_NVML_NO_V3
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *count,
                                                                 nvmlProcessInfo_t *infos) {
    return running_processes(device, count, infos, LAYOUT_V2, 0);
}
#endif
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                 unsigned int *count,
                                                                 nvmlProcessInfo_t *infos) {
    return running_processes(device, count, infos, LAYOUT_V2, 0);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                              unsigned int *count,
                                                              nvmlProcessInfo_v1_t *infos) {
    return running_processes(device, count, infos, LAYOUT_V1, 0);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                                  unsigned int *count,
                                                                  nvmlProcessInfo_t *infos) {
    return running_processes(device, count, infos, LAYOUT_V2, 1);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                                  unsigned int *count,
                                                                  nvmlProcessInfo_t *infos) {
    return running_processes(device, count, infos, LAYOUT_V2, 1);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
                                                               unsigned int *count,
                                                               nvmlProcessInfo_v1_t *infos) {
    return running_processes(device, count, infos, LAYOUT_V1, 1);
}

/* ---- topology: static placement (topo records) and NVLinks (nvlink records) ---- */

/* Switches two GPUs share, counted from the host bridge down their "a/b" paths; *same_leaf
 * when both paths are that shared part exactly (the same last switch). */
static unsigned int shared_switches(const char *a, const char *b, int *same_leaf) {
    unsigned int shared = 0;
    *same_leaf = 0;
    if (*a == '\0' || *b == '\0') return 0;
    for (;;) {
        size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
        if (la != lb || strncmp(a, b, la) != 0) return shared;
        shared++;
        a += la;
        b += lb;
        if (*a == '\0' || *b == '\0') {
            *same_leaf = *a == '\0' && *b == '\0';
            return shared;
        }
        a++;
        b++;
    }
}

static unsigned int common_level(const struct fake_topo *x, const struct fake_topo *y) {
    if (x->numa != y->numa) return TOPOLOGY_SYSTEM;
    if (x->bridge != y->bridge) return TOPOLOGY_NODE;
    int same_leaf;
    if (shared_switches(x->switches, y->switches, &same_leaf) == 0) return TOPOLOGY_HOSTBRIDGE;
    return same_leaf ? TOPOLOGY_SINGLE : TOPOLOGY_MULTIPLE;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                             nvmlDevice_t device2,
                                                             unsigned int *pathInfo) {
    struct fake_gpu *g1, *g2;
    struct fake_mig *m1, *m2;
    pthread_mutex_lock(&g_lock);
    if (g_init_count == 0) return unlock_with(NVML_ERROR_UNINITIALIZED);
    if (resolve_locked(device1, &g1, &m1) != NVML_SUCCESS ||
        resolve_locked(device2, &g2, &m2) != NVML_SUCCESS || pathInfo == NULL || g1 == g2)
        return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    if (m1 != NULL || m2 != NULL) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    const struct fake_topo *t1 = &g_state.topo[g1->index], *t2 = &g_state.topo[g2->index];
    if (!t1->placed || !t2->placed) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    *pathInfo = common_level(t1, t2);
    return unlock_with(NVML_SUCCESS);
}

/* Enters with the lock held and *out the GPU's link, as every NVLink query gates it. */
static nvmlReturn_t enter_link(nvmlDevice_t device, unsigned int link, void *result,
                               struct fake_link **out) {
    struct fake_gpu *g;
    nvmlReturn_t rc = enter_device(device, &g, 1);
    if (rc != NVML_SUCCESS) return rc;
    struct fake_topo *t = &g_state.topo[g->index];
    if (result == NULL) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    if (t->nvlink_error != NVML_SUCCESS) return unlock_with(t->nvlink_error);
    if (!t->has_nvlink) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    if (link >= FAKE_NVLINKS) return unlock_with(NVML_ERROR_INVALID_ARGUMENT);
    *out = &t->links[link];
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                  unsigned int *isActive) {
    struct fake_link *l;
    nvmlReturn_t rc = enter_link(device, link, isActive, &l);
    if (rc != NVML_SUCCESS) return rc;
    *isActive = l->active ? 1u : 0u; /* NVML_FEATURE_ENABLED / NVML_FEATURE_DISABLED */
    return unlock_with(NVML_SUCCESS);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device,
                                                             unsigned int link,
                                                             nvmlPciInfo_t *pci) {
    struct fake_link *l;
    nvmlReturn_t rc = enter_link(device, link, pci, &l);
    if (rc != NVML_SUCCESS) return rc;
    if (!l->active) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busIdLegacy, l->bus_id_legacy, sizeof pci->busIdLegacy);
    memcpy(pci->busId, l->bus_id, sizeof pci->busId);
    pci->domain = l->domain;
    pci->bus = l->bus;
    pci->device = l->device;
    pci->pciDeviceId = l->type == NVLINK_DEVICE_GPU ? PCI_DEVICE_ID : 0;
    return unlock_with(NVML_SUCCESS);
}

#ifndef FAKE_NVML_NO_NVLINK_TYPE
NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device,
                                                             unsigned int link,
                                                             unsigned int *type) {
    struct fake_link *l;
    nvmlReturn_t rc = enter_link(device, link, type, &l);
    if (rc != NVML_SUCCESS) return rc;
    if (!l->active) return unlock_with(NVML_ERROR_NOT_SUPPORTED);
    *type = l->type;
    return unlock_with(NVML_SUCCESS);
}
#endif
