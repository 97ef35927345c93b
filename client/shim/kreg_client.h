/* kreg_client.h: the C ABI of libkreg_client.so, the in-process client shim
 * of kregd (DESIGN §3). Used by JAX processes (through the Python package
 * `kreg` over ctypes) to open sessions with the daemon, register targets and
 * obtain per-target forwarding XLA FFI handlers.
 *
 * Conventions (as in xla/ffi/api/c_api.h):
 *  - every args struct starts with `struct_size`; set it to the
 *    KREG_<Struct>_STRUCT_SIZE of the header you compiled against;
 *  - strings cross as pointer + length (not necessarily NUL-terminated);
 *    strings handed out by the library are NUL-terminated;
 *  - functions that can fail return a KREG_Error* (NULL = success); the
 *    caller owns a returned error and destroys it with kreg_error_destroy;
 *  - fields marked `out` are written by the library.
 *
 * Versioning: KREG_API_MAJOR changes on ABI-incompatible changes; MINOR when
 * fields or functions are added. The library and the `kreg` package ship
 * together, so a struct_size below this header's is refused.
 */
#ifndef KREGD_CLIENT_SHIM_KREG_CLIENT_H_
#define KREGD_CLIENT_SHIM_KREG_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#define KREG_API_MAJOR 1
#define KREG_API_MINOR 7

#if defined(__GNUC__)
#define KREG_EXPORT __attribute__((visibility("default")))
#else
#define KREG_EXPORT
#endif

#define KREG_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Errors --------------------------------------------------------- */

/* Codes follow absl's canonical list (same values as XLA_FFI_Error_Code). */
typedef enum {
  KREG_OK = 0,
  KREG_CANCELLED = 1,
  KREG_UNKNOWN = 2,
  KREG_INVALID_ARGUMENT = 3,
  KREG_DEADLINE_EXCEEDED = 4,
  KREG_NOT_FOUND = 5,
  KREG_ALREADY_EXISTS = 6,
  KREG_PERMISSION_DENIED = 7,
  KREG_RESOURCE_EXHAUSTED = 8,
  KREG_FAILED_PRECONDITION = 9,
  KREG_ABORTED = 10,
  KREG_OUT_OF_RANGE = 11,
  KREG_UNIMPLEMENTED = 12,
  KREG_INTERNAL = 13,
  KREG_UNAVAILABLE = 14,
  KREG_DATA_LOSS = 15,
  KREG_UNAUTHENTICATED = 16,
} KREG_ErrorCode;

typedef struct KREG_Error KREG_Error;

KREG_EXPORT int32_t kreg_error_code(const KREG_Error* error);
/* NUL-terminated; owned by `error`, valid until it is destroyed. */
KREG_EXPORT const char* kreg_error_message(const KREG_Error* error);
/* Destroys an error returned by this library. NULL is a no-op. */
KREG_EXPORT void kreg_error_destroy(KREG_Error* error);

/* ---- Versions ------------------------------------------------------- */

typedef struct KREG_Version {
  size_t struct_size;
  int32_t api_major;     /* out: KREG_API_MAJOR of the library */
  int32_t api_minor;     /* out */
  int32_t ffi_api_major; /* out: XLA FFI API the handlers were built with */
  int32_t ffi_api_minor; /* out */
} KREG_Version;
#define KREG_Version_STRUCT_SIZE KREG_STRUCT_SIZE(KREG_Version, ffi_api_minor)

KREG_EXPORT void kreg_get_version(KREG_Version* version);

/* ---- Client --------------------------------------------------------- */

/* A connection to one kregd (a pool of sessions on its session socket).
 * Owned by the library and alive for the rest of the process: forwarding
 * handlers registered with XLA keep using it. */
typedef struct KREG_Client KREG_Client;

typedef struct KREG_ConnectArgs {
  size_t struct_size;
  const char* session_path; /* the session socket: <gRPC socket>.session */
  size_t session_path_len;
  KREG_Client* client; /* out: the same client for the same path */
} KREG_ConnectArgs;
#define KREG_ConnectArgs_STRUCT_SIZE KREG_STRUCT_SIZE(KREG_ConnectArgs, client)

/* Opens (or reuses) the client for `session_path` and checks, on its
 * control connection, that the daemon answers and speaks this library's
 * protocol: UNAVAILABLE (with the path and reason) when it does not answer,
 * FAILED_PRECONDITION (both versions) for another major. Starts no
 * executor: sessions open at the first call that needs one. */
KREG_EXPORT KREG_Error* kreg_connect(KREG_ConnectArgs* args);

/* ---- Targets ---------------------------------------------------------- */

typedef struct KREG_TargetList KREG_TargetList;

/* One registry entry. Strings are NUL-terminated and owned by the list. */
typedef struct KREG_TargetInfo {
  size_t struct_size;
  const char* target_name;
  const char* platform;
  const char* func_name;
  const char* content_id;
  const char* module_digest;
  uint64_t module_size;
  const char* kind;
  uint32_t ffi_api_major;
  uint32_t ffi_api_minor;
  uint32_t traits;
  uint32_t uid;
  uint32_t gid;
  int32_t pid;
  int64_t registered_at_us;
  const char* origin;
  /* "" when this kregd can run the target, else why not (e.g. a cuda
   * target on a daemon without a usable GPU). */
  const char* not_runnable;
  /* In cluster mode the host whose registration made the binding
   * ("<host name> (<address>)"); "" on a standalone kregd. */
  const char* host;
} KREG_TargetInfo;
#define KREG_TargetInfo_STRUCT_SIZE KREG_STRUCT_SIZE(KREG_TargetInfo, host)

KREG_EXPORT size_t kreg_target_list_size(const KREG_TargetList* list);
/* Fills `info` (its struct_size set by the caller) with entry `index`.
 * OUT_OF_RANGE for a bad index. */
KREG_EXPORT KREG_Error* kreg_target_list_get(const KREG_TargetList* list,
                                             size_t index,
                                             KREG_TargetInfo* info);
/* Destroys a list returned by this library. NULL is a no-op. */
KREG_EXPORT void kreg_target_list_destroy(KREG_TargetList* list);

typedef struct KREG_RegisterArgs {
  size_t struct_size;
  KREG_Client* client;
  const char* target_name;
  size_t target_name_len;
  const char* func_name;
  size_t func_name_len;
  const char* platform; /* "cpu"/"host"/"cuda"/"gpu", any case */
  size_t platform_len;
  const char* content_id; /* optional (NULL or empty) */
  size_t content_id_len;
  /* Exactly one module source: a path on the daemon's host (read by the
   * daemon), or the module's bytes (uploaded; copied by the library). */
  const char* module_path;
  size_t module_path_len;
  const void* module_bytes;
  size_t module_bytes_len;
  int32_t replace;
  int32_t created;         /* out: 0 when an identical entry existed */
  KREG_TargetList* target; /* out: the entry; caller destroys */
  /* Nonzero registers an in-process target (a callable that runs
   * inside the registering process, e.g. kreg.numba_cuda_callable): no
   * module (both module fields NULL), content_id required (the callable's
   * fingerprint); listed with kind "in-process" and this process's pid. */
  int32_t in_process;
} KREG_RegisterArgs;
#define KREG_RegisterArgs_STRUCT_SIZE \
  KREG_STRUCT_SIZE(KREG_RegisterArgs, in_process)

/* Registers through the session. The daemon's refusal comes back with its
 * code (e.g. FAILED_PRECONDITION for a content change) and message. The
 * registration is remembered and replayed (idempotently) whenever the
 * client has to reconnect to a restarted daemon. */
KREG_EXPORT KREG_Error* kreg_register(KREG_RegisterArgs* args);

typedef struct KREG_ListArgs {
  size_t struct_size;
  KREG_Client* client;
  KREG_TargetList* targets; /* out: caller destroys */
} KREG_ListArgs;
#define KREG_ListArgs_STRUCT_SIZE KREG_STRUCT_SIZE(KREG_ListArgs, targets)

KREG_EXPORT KREG_Error* kreg_list_targets(KREG_ListArgs* args);

/* ---- Forwarding handlers -------------------------------------------- */

typedef struct KREG_BindArgs {
  size_t struct_size;
  KREG_Client* client;
  const char* target_name;
  size_t target_name_len;
  const char* platform;
  size_t platform_len;
  /* out: an XLA_FFI_Handler* that forwards every call to the daemon's
   * (target_name, platform). Valid for the rest of the process; the same
   * pointer for the same (target_name, platform). */
  void* handler;
  int32_t slot; /* out: trampoline slot index */
  /* 1.6: a generation to pin (docs/replace.md §7): every call runs that
   * generation, also after the target is replaced. 0 follows the current
   * generation. */
  uint32_t generation;
  /* 1.7: nonzero when the target is a handler bundle with an instantiate
   * stage (docs/kernel-author-guide.md, "Handler bundles and state"):
   * register `handler` with XLA as both its instantiate and its execute
   * stage, after registering kreg_forwarded_state_type's type. The
   * instantiate stage runs in kregd's executor, which keeps the state;
   * XLA keeps its handle. Read only when struct_size covers it. */
  uint32_t stateful;
} KREG_BindArgs;
/* The smallest struct_size accepted (1.6); 1.7 callers pass the whole. */
#define KREG_BindArgs_STRUCT_SIZE KREG_STRUCT_SIZE(KREG_BindArgs, generation)

/* RESOURCE_EXHAUSTED when every trampoline slot is taken,
 * FAILED_PRECONDITION when (target, platform) is bound to another client
 * or, in this process, at another generation; NOT_FOUND (listing the
 * generations there are) when kregd has no such generation. */
KREG_EXPORT KREG_Error* kreg_bind(KREG_BindArgs* args);

/* 1.7: the forwarding handlers' own state type, for stateful bindings. */
typedef struct KREG_StateTypeArgs {
  size_t struct_size;
  const char* name;      /* out: its name (static) */
  void* type_id;         /* out: its XLA_FFI_TypeId* */
  const void* type_info; /* out: its const XLA_FFI_TypeInfo* */
} KREG_StateTypeArgs;
#define KREG_StateTypeArgs_STRUCT_SIZE \
  KREG_STRUCT_SIZE(KREG_StateTypeArgs, type_info)

/* Fills `args` (nothing when it is too small). Register the type with XLA
 * (jax.ffi.register_ffi_type) once, before the first stateful binding's
 * handler. */
KREG_EXPORT void kreg_forwarded_state_type(KREG_StateTypeArgs* args);

/* ---- Local execution ------------------------------------------------ */

typedef struct KREG_BindLocalArgs {
  size_t struct_size;
  KREG_Client* client;
  const char* target_name;
  size_t target_name_len;
  const char* platform;
  size_t platform_len;
  /* out: the genuine XLA_FFI_Handler* of the registered module, loaded into
   * this process: kregd hands out the stored bytes as a sealed memfd; the
   * library checks seals, size and digest, dlopens it (RTLD_LOCAL) and
   * keeps it loaded for the rest of the process. The same pointer for the
   * same (target_name, platform); targets of one module share one copy. */
  void* handler;
  KREG_TargetList* target; /* out: the registry entry; caller destroys */
  /* 1.6: a generation to pin, as KREG_BindArgs.generation: the handler is
   * that generation's and is kept when the target is replaced. */
  uint32_t generation;
  /* 1.7, out (filled when struct_size covers them): a handler bundle's
   * genuine handler per XLA FFI stage (instantiate, prepare, initialize,
   * execute; NULL where it has none), and its state type: the name
   * (static), the loaded module's XLA_FFI_TypeId* and XLA_FFI_TypeInfo*
   * (NULL: none). Register the type with XLA (jax.ffi.register_ffi_type)
   * when its id is still 0, then the handlers as a stage dict. */
  void* stage_handlers[4];
  const char* state_type_name;
  void* state_type_id;
  const void* state_type_info;
} KREG_BindLocalArgs;
/* The smallest struct_size accepted (1.6); 1.7 callers pass the whole. */
#define KREG_BindLocalArgs_STRUCT_SIZE \
  KREG_STRUCT_SIZE(KREG_BindLocalArgs, generation)

/* Binds (target_name, platform) for local execution. kregd applies every
 * registration rule first: NOT_FOUND for an unregistered name,
 * NOT_FOUND (listing them) for a generation the target does not have,
 * FAILED_PRECONDITION for a quarantined target or an in-process callable
 * or when this process bound it at another generation,
 * PERMISSION_DENIED when its site policy is local_execution = "deny";
 * DATA_LOSS when the bytes handed out are not the registered ones. kregd
 * records the hold (retire refuses while this process lives) and it is
 * re-recorded after a reconnect. Register the handler with XLA yourself
 * (jax.ffi.register_ffi_target). */
KREG_EXPORT KREG_Error* kreg_bind_local(KREG_BindLocalArgs* args);

typedef struct KREG_ClientStats {
  size_t struct_size;
  KREG_Client* client;
  uint64_t launches;      /* out: forwarded calls */
  uint64_t launch_errors; /* out */
  uint64_t reconnects;    /* out: times a session was re-opened after the
                             daemon went away */
  uint64_t sessions;      /* out: sessions currently open */
  int32_t slots_used;     /* out: trampoline slots bound (process-wide) */
  int32_t slots_total;    /* out */
} KREG_ClientStats;
#define KREG_ClientStats_STRUCT_SIZE \
  KREG_STRUCT_SIZE(KREG_ClientStats, slots_total)

KREG_EXPORT void kreg_client_stats(KREG_ClientStats* stats);

/* Stage tracing, for benchmarks (bench/, DESIGN §9). With
 * KREG_TRACE_STAGES=1 in the environment, every forwarded call that goes on
 * the launch ring records when it passed each stage: CLOCK_MONOTONIC
 * nanoseconds, 0 for a stage not reached, the executor's stamps included.
 * Indices of KREG_StageRecord.ns: */
enum {
  KREG_STAGE_ENTER = 0,     /* XLA called the forwarding handler */
  KREG_STAGE_PREPARED,      /* inputs ready (CPU: copied into the arena) */
  KREG_STAGE_PUBLISHED,     /* descriptor published on the ring */
  KREG_STAGE_PICKED,        /* executor: its ring thread took it */
  KREG_STAGE_DECODED,       /* executor: validated and decoded */
  KREG_STAGE_HANDLER_START, /* executor: call frame built, handler starts */
  KREG_STAGE_HANDLER_END,   /* executor: the handler returned */
  KREG_STAGE_COMPLETED,     /* executor: completion about to be published */
  KREG_STAGE_WOKE,          /* the client saw the completion */
  KREG_STAGE_RETURNED,      /* the forwarding handler returns to XLA */
  KREG_STAGE_POINTS
};
typedef struct KREG_StageRecord {
  int32_t platform; /* 0 cpu, 1 cuda */
  int32_t reserved;
  int64_t ns[KREG_STAGE_POINTS];
} KREG_StageRecord;

typedef struct KREG_StageTraceArgs {
  size_t struct_size;
  size_t record_size;        /* sizeof(KREG_StageRecord) */
  KREG_StageRecord* records; /* out: room for `capacity` records */
  size_t capacity;
  size_t count; /* out: records written (taken, oldest first) */
} KREG_StageTraceArgs;
#define KREG_StageTraceArgs_STRUCT_SIZE \
  KREG_STRUCT_SIZE(KREG_StageTraceArgs, count)

/* Takes up to `capacity` of the records kept (at most 262144 are kept; the
 * rest are dropped). INVALID_ARGUMENT for a record_size this library does
 * not know. */
KREG_EXPORT KREG_Error* kreg_stage_trace(KREG_StageTraceArgs* args);

#ifdef __cplusplus
}
#endif

#endif /* KREGD_CLIENT_SHIM_KREG_CLIENT_H_ */
