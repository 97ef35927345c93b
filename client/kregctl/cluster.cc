#include <cstdio>
#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "client/kregctl/common.h"

namespace kreg {

int ListCluster(Client& client, bool as_json) {
  auto all = client.ClusterTargets();
  if (!all.ok()) return Fail(all.status());
  if (as_json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const v1::Target& t : all->targets()) j.push_back(TargetJson(t));
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("cluster %s (etcd revision %lld)\n", all->cluster().c_str(),
              static_cast<long long>(all->revision()));
  std::printf("%-32s %-5s %-20s %-22s %-7s %-6s %s\n", "NAME", "PLAT",
              "FUNCTION", "CONTENT", "KIND", "UID", "HOST");
  for (const v1::Target& t : all->targets()) {
    std::printf("%-32s %-5s %-20s %-22s %-7s %-6u %s\n",
                t.target_name().c_str(), t.platform().c_str(),
                t.func_name().c_str(), t.content_id().substr(0, 22).c_str(),
                t.kind().c_str(), t.audit().uid(), t.audit().host().c_str());
  }
  return 0;
}

namespace {

// The hosts advertised in etcd: address, name, lease, modules held.
int ListHosts(Client& client, bool as_json) {
  auto hosts = client.Hosts();
  if (!hosts.ok()) return Fail(hosts.status());
  if (as_json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const v1::ClusterHost& h : hosts->hosts()) {
      nlohmann::ordered_json modules = nlohmann::ordered_json::array();
      for (const std::string& m : h.modules()) modules.push_back(m);
      char lease[32];
      std::snprintf(lease, sizeof(lease), "%llx",
                    static_cast<unsigned long long>(h.lease_id()));
      j.push_back({{"address", h.address()},
                   {"host_name", h.host_name()},
                   {"version", h.version()},
                   {"pid", h.pid()},
                   {"lease", lease},
                   {"lease_ttl_s", h.lease_ttl_s()},
                   {"self", h.self()},
                   {"modules", modules}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("cluster %s\n", hosts->cluster().c_str());
  std::printf("%-24s %-20s %-8s %-18s %-8s %s\n", "ADDRESS", "HOST", "PID",
              "LEASE", "TTL", "MODULES");
  for (const v1::ClusterHost& h : hosts->hosts()) {
    std::printf("%-24s %-20s %-8d %-18llx %-8lld %d%s\n", h.address().c_str(),
                h.host_name().c_str(), h.pid(),
                static_cast<unsigned long long>(h.lease_id()),
                static_cast<long long>(h.lease_ttl_s()), h.modules_size(),
                h.self() ? "  (this kregd)" : "");
    for (const std::string& m : h.modules()) std::printf("    %s\n", m.c_str());
  }
  return 0;
}

}  // namespace

Command AddHostsCommand(CLI::App& app) {
  auto as_json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "hosts", "cluster mode: the kregd hosts, their leases and modules");
  cmd->add_flag("--json", *as_json, "print JSON");
  return {cmd, [as_json](Connection& kregd) {
            return ListHosts(*kregd.client, *as_json);
          }};
}

}  // namespace kreg
