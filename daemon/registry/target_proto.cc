#include "daemon/registry/target_proto.h"

#include <algorithm>

#include "common/handler_spec.h"
#include "common/status_macros.h"
#include "daemon/base/validate.h"

namespace kreg {

void DescribeStages(const std::string& func_name, v1::Target* t) {
  HandlerSpec spec;
  std::string error;
  if (!ParseHandlerSpec(func_name, &spec, &error) || !spec.IsBundle()) return;
  for (int i = 0; i < kNumHandlerStages; ++i) {
    if (spec.stages[i].empty()) continue;
    v1::StageFunction* f = t->add_stages();
    f->set_stage(HandlerStageName(i));
    f->set_symbol(spec.stages[i]);
  }
  if (!spec.state_type.empty()) {
    t->mutable_state_type()->set_name(spec.state_type.name);
    t->mutable_state_type()->set_type_id_symbol(spec.state_type.id_symbol);
    t->mutable_state_type()->set_type_info_symbol(spec.state_type.info_symbol);
  }
}

v1::Target ToProto(const TargetEntry& e) {
  v1::Target t;
  t.set_target_name(e.key.name);
  t.set_platform(PlatformName(e.key.platform));
  t.set_func_name(e.func_name);
  DescribeStages(e.func_name, &t);
  t.set_content_id(e.content_id);
  t.set_module_digest(e.module_digest);
  t.set_module_size(e.module_size);
  t.set_kind(TargetKindName(e.kind));
  t.set_ffi_api_major(e.handler_info.api_major);
  t.set_ffi_api_minor(e.handler_info.api_minor);
  t.set_traits(e.handler_info.traits);
  v1::Audit* a = t.mutable_audit();
  a->set_uid(e.registered_by.uid);
  a->set_gid(e.registered_by.gid);
  a->set_pid(e.registered_by.pid);
  a->set_registered_at_us(e.registered_at_us);
  a->set_origin(e.origin);
  a->set_host(e.host);
  t.set_generation(e.generation);
  for (const Generation& g : e.generations) {
    v1::Generation* p = t.add_generations();
    p->set_generation(g.generation);
    p->set_content_id(g.content_id);
    p->set_module_digest(g.module_digest);
    p->set_module_size(g.module_size);
    p->set_func_name(g.func_name);
    p->set_ffi_api_major(g.handler_info.api_major);
    p->set_ffi_api_minor(g.handler_info.api_minor);
    p->set_traits(g.handler_info.traits);
    p->set_uid(g.by.uid);
    p->set_gid(g.by.gid);
    p->set_pid(g.by.pid);
    p->set_at_us(g.at_us);
    p->set_origin(g.origin);
  }
  return t;
}

v1::TargetStats StatsToProto(const TargetKey& key, const TargetStats& stats) {
  v1::TargetStats t;
  t.set_target_name(key.name);
  t.set_platform(PlatformName(key.platform));
  t.set_launches(stats.launches);
  t.set_errors(stats.errors);
  v1::LatencySummary* l = t.mutable_latency();
  l->set_count(stats.count());
  const double p50 = stats.QuantileNs(0.50) / 1000;
  const double p90 = std::max(p50, stats.QuantileNs(0.90) / 1000);
  const double p99 = std::max(p90, stats.QuantileNs(0.99) / 1000);
  l->set_p50_us(p50);
  l->set_p90_us(p90);
  l->set_p99_us(p99);
  l->set_sum_us(static_cast<double>(stats.sum_ns) / 1000);
  return t;
}

absl::StatusOr<TargetEntry> FromProto(const v1::Target& t) {
  KREG_RETURN_IF_ERROR(ValidateTargetName(t.target_name()));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(t.platform()));
  TargetEntry e;
  e.key = {t.target_name(), platform};
  if (t.kind() == "in-process") {
    e.kind = TargetKind::kInProcess;
  } else if (!t.kind().empty() && t.kind() != "module") {
    return absl::InvalidArgumentError("unknown target kind \"" + t.kind() +
                                      "\"");
  }
  e.func_name = t.func_name();
  e.content_id = t.content_id();
  e.module_digest = t.module_digest();
  e.module_size = t.module_size();
  e.handler_info.api_major = t.ffi_api_major();
  e.handler_info.api_minor = t.ffi_api_minor();
  e.handler_info.traits = t.traits();
  e.registered_by.uid = t.audit().uid();
  e.registered_by.gid = t.audit().gid();
  e.registered_by.pid = t.audit().pid();
  e.registered_at_us = t.audit().registered_at_us();
  e.origin = t.audit().origin();
  e.host = t.audit().host();
  // A record from before generations existed has none: generation 1.
  e.generation = std::max<uint32_t>(t.generation(), 1);
  for (const v1::Generation& p : t.generations()) {
    Generation g;
    g.generation = p.generation();
    g.content_id = p.content_id();
    g.module_digest = p.module_digest();
    g.module_size = p.module_size();
    g.func_name = p.func_name();
    g.handler_info = {p.ffi_api_major(), p.ffi_api_minor(), p.traits()};
    g.by = PeerCred{p.uid(), p.gid(), p.pid()};
    g.at_us = p.at_us();
    g.origin = p.origin();
    e.generations.push_back(std::move(g));
  }
  return e;
}

}  // namespace kreg
