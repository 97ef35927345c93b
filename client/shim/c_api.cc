// The extern "C" surface of libkreg_client.so (kreg_client.h).
#include "xla/ffi/api/c_api.h"

#include <string.h>

#include <new>
#include <string>
#include <vector>

#include "client/shim/client.h"
#include "client/shim/forward.h"
#include "client/shim/kreg_client.h"
#include "client/shim/local_bind.h"

struct KREG_Error {
  int32_t code;
  std::string message;
};

struct KREG_TargetList {
  std::vector<kreg::v1::Target> targets;
};

namespace {

using kreg::ClientStatus;
using kreg::shim::Client;

KREG_Error* ToError(const ClientStatus& s) {
  if (s.ok()) return nullptr;
  return new KREG_Error{s.code, s.message};
}

KREG_Error* Invalid(const std::string& message) {
  return new KREG_Error{KREG_INVALID_ARGUMENT, message};
}

std::string Str(const char* p, size_t n) {
  return p == nullptr ? std::string() : std::string(p, n);
}

Client* AsClient(KREG_Client* c) { return reinterpret_cast<Client*>(c); }

}  // namespace

extern "C" {

int32_t kreg_error_code(const KREG_Error* error) {
  return error == nullptr ? KREG_OK : error->code;
}

const char* kreg_error_message(const KREG_Error* error) {
  return error == nullptr ? "" : error->message.c_str();
}

void kreg_error_destroy(KREG_Error* error) { delete error; }

void kreg_get_version(KREG_Version* version) {
  if (version == nullptr || version->struct_size < KREG_Version_STRUCT_SIZE) {
    return;
  }
  version->api_major = KREG_API_MAJOR;
  version->api_minor = KREG_API_MINOR;
  version->ffi_api_major = XLA_FFI_API_MAJOR;
  version->ffi_api_minor = XLA_FFI_API_MINOR;
}

KREG_Error* kreg_connect(KREG_ConnectArgs* args) {
  if (args == nullptr || args->struct_size < KREG_ConnectArgs_STRUCT_SIZE) {
    return Invalid("kreg_connect: bad args struct");
  }
  std::string path = Str(args->session_path, args->session_path_len);
  if (path.empty()) return Invalid("kreg_connect: empty session socket path");
  Client* client = Client::ForPath(path);
  args->client = reinterpret_cast<KREG_Client*>(client);
  return ToError(client->Ping());
}

size_t kreg_target_list_size(const KREG_TargetList* list) {
  return list == nullptr ? 0 : list->targets.size();
}

KREG_Error* kreg_target_list_get(const KREG_TargetList* list, size_t index,
                                 KREG_TargetInfo* info) {
  if (list == nullptr || info == nullptr ||
      info->struct_size < KREG_TargetInfo_STRUCT_SIZE) {
    return Invalid("kreg_target_list_get: bad arguments");
  }
  if (index >= list->targets.size()) {
    return new KREG_Error{KREG_OUT_OF_RANGE,
                          "target index " + std::to_string(index) +
                              " out of range (" +
                              std::to_string(list->targets.size()) + ")"};
  }
  const kreg::v1::Target& t = list->targets[index];
  info->target_name = t.target_name().c_str();
  info->platform = t.platform().c_str();
  info->func_name = t.func_name().c_str();
  info->content_id = t.content_id().c_str();
  info->module_digest = t.module_digest().c_str();
  info->module_size = t.module_size();
  info->kind = t.kind().c_str();
  info->ffi_api_major = t.ffi_api_major();
  info->ffi_api_minor = t.ffi_api_minor();
  info->traits = t.traits();
  info->uid = t.audit().uid();
  info->gid = t.audit().gid();
  info->pid = t.audit().pid();
  info->registered_at_us = t.audit().registered_at_us();
  info->origin = t.audit().origin().c_str();
  info->not_runnable = t.not_runnable().c_str();
  info->host = t.audit().host().c_str();
  return nullptr;
}

void kreg_target_list_destroy(KREG_TargetList* list) { delete list; }

KREG_Error* kreg_register(KREG_RegisterArgs* args) {
  if (args == nullptr || args->struct_size < KREG_RegisterArgs_STRUCT_SIZE ||
      args->client == nullptr) {
    return Invalid("kreg_register: bad args struct or no client");
  }
  bool in_process = args->in_process != 0;
  bool has_path = args->module_path != nullptr;
  bool has_bytes = args->module_bytes != nullptr;
  if (in_process && (has_path || has_bytes)) {
    return Invalid(
        "kreg_register: an in-process target carries no module (set neither "
        "module_path nor module_bytes)");
  }
  if (!in_process && has_path == has_bytes) {
    return Invalid(
        "kreg_register: give exactly one of module_path and module_bytes");
  }
  kreg::shim::Registration reg;
  kreg::v1::RegisterTargetHeader& h = reg.header;
  h.set_target_name(Str(args->target_name, args->target_name_len));
  h.set_func_name(Str(args->func_name, args->func_name_len));
  h.set_platform(Str(args->platform, args->platform_len));
  h.set_content_id(Str(args->content_id, args->content_id_len));
  h.set_replace(args->replace != 0);
  h.set_in_process(in_process);
  if (has_path) {
    h.mutable_module()->set_path(Str(args->module_path, args->module_path_len));
  } else if (has_bytes) {
    reg.module.assign(static_cast<const char*>(args->module_bytes),
                      args->module_bytes_len);
    h.mutable_module()->set_upload_size(reg.module.size());
  }
  kreg::v1::RegisterTargetResponse reply;
  ClientStatus s = AsClient(args->client)->Register(reg, &reply);
  if (!s.ok()) return ToError(s);
  args->created = reply.created() ? 1 : 0;
  auto* list = new KREG_TargetList;
  list->targets.push_back(reply.target());
  args->target = list;
  return nullptr;
}

KREG_Error* kreg_list_targets(KREG_ListArgs* args) {
  if (args == nullptr || args->struct_size < KREG_ListArgs_STRUCT_SIZE ||
      args->client == nullptr) {
    return Invalid("kreg_list_targets: bad args struct or no client");
  }
  kreg::v1::ListTargetsResponse reply;
  ClientStatus s = AsClient(args->client)->List(&reply);
  if (!s.ok()) return ToError(s);
  auto* list = new KREG_TargetList;
  list->targets.assign(reply.targets().begin(), reply.targets().end());
  args->targets = list;
  return nullptr;
}

KREG_Error* kreg_bind(KREG_BindArgs* args) {
  if (args == nullptr || args->struct_size < KREG_BindArgs_STRUCT_SIZE ||
      args->client == nullptr) {
    return Invalid("kreg_bind: bad args struct or no client");
  }
  kreg::shim::Binding binding;
  const bool stateful =
      args->struct_size >= KREG_STRUCT_SIZE(KREG_BindArgs, stateful) &&
      args->stateful != 0;
  ClientStatus s = kreg::shim::Bind(
      AsClient(args->client), Str(args->target_name, args->target_name_len),
      Str(args->platform, args->platform_len), args->generation, &binding,
      stateful);
  if (!s.ok()) return ToError(s);
  args->handler = binding.handler;
  args->slot = binding.slot;
  return nullptr;
}

void kreg_forwarded_state_type(KREG_StateTypeArgs* args) {
  if (args == nullptr || args->struct_size < KREG_StateTypeArgs_STRUCT_SIZE) {
    return;
  }
  args->name = kreg::shim::kForwardedStateType;
  args->type_id = kreg::shim::ForwardedStateTypeId();
  args->type_info = kreg::shim::ForwardedStateTypeInfo();
}

KREG_Error* kreg_bind_local(KREG_BindLocalArgs* args) {
  if (args == nullptr || args->struct_size < KREG_BindLocalArgs_STRUCT_SIZE ||
      args->client == nullptr) {
    return Invalid("kreg_bind_local: bad args struct or no client");
  }
  std::string target = Str(args->target_name, args->target_name_len);
  std::string platform = Str(args->platform, args->platform_len);
  if (target.empty()) return Invalid("kreg_bind_local: empty target name");
  kreg::shim::LocalBinding binding;
  ClientStatus s = kreg::shim::BindLocal(AsClient(args->client), target,
                                         platform, args->generation, &binding);
  if (!s.ok()) return ToError(s);
  args->handler = binding.handler;
  if (args->struct_size >=
      KREG_STRUCT_SIZE(KREG_BindLocalArgs, state_type_info)) {
    for (int i = 0; i < 4; ++i) args->stage_handlers[i] = binding.stages[i];
    args->state_type_name = binding.state_type_name;
    args->state_type_id = binding.state_type_id;
    args->state_type_info = binding.state_type_info;
  }
  auto* list = new KREG_TargetList;
  list->targets.push_back(binding.target);
  args->target = list;
  return nullptr;
}

void kreg_client_stats(KREG_ClientStats* stats) {
  if (stats == nullptr || stats->struct_size < KREG_ClientStats_STRUCT_SIZE) {
    return;
  }
  stats->slots_used = kreg::shim::SlotsUsed();
  stats->slots_total = kreg::shim::kNumSlots;
  Client* c = AsClient(stats->client);
  if (c == nullptr) return;
  stats->launches = c->launches.load();
  stats->launch_errors = c->launch_errors.load();
  stats->reconnects = c->reconnects();
  stats->sessions = c->open_sessions();
}

KREG_Error* kreg_stage_trace(KREG_StageTraceArgs* args) {
  if (args == nullptr || args->struct_size < KREG_StageTraceArgs_STRUCT_SIZE) {
    return Invalid(
        "kreg_stage_trace: args is null or its struct_size is too small");
  }
  static_assert(static_cast<int>(KREG_STAGE_POINTS) ==
                    static_cast<int>(kreg::stage::kPoints),
                "KREG_STAGE_* follow stage::Point");
  if (args->record_size != sizeof(KREG_StageRecord)) {
    return Invalid("kreg_stage_trace: record_size " +
                   std::to_string(args->record_size) + " is not " +
                   std::to_string(sizeof(KREG_StageRecord)) +
                   " (a kreg_client.h of another version)");
  }
  args->count = 0;
  if (args->records == nullptr) return nullptr;
  for (const kreg::shim::StageRecord& r :
       kreg::shim::TakeStageRecords(args->capacity)) {
    KREG_StageRecord& out = args->records[args->count++];
    out.platform = r.platform;
    out.reserved = 0;
    for (int i = 0; i < KREG_STAGE_POINTS; ++i) out.ns[i] = r.times.ns[i];
  }
  return nullptr;
}

}  // extern "C"
