// kregctl's cluster-mode commands: `list --cluster` and `hosts`.
#ifndef KREGD_CLIENT_KREGCTL_CLUSTER_H_
#define KREGD_CLIENT_KREGCTL_CLUSTER_H_

#include <functional>

#include "absl/status/status.h"
#include "client/client.h"
#include "nlohmann/json.hpp"

namespace kreg {

using TargetToJson = std::function<nlohmann::json(const v1::Target&)>;
using FailWith = std::function<int(const absl::Status&)>;

// Every binding in etcd (a table with the registering host, or JSON).
// Returns the exit code; errors go through `fail`.
int ListCluster(Client& client, bool as_json, const TargetToJson& to_json,
                const FailWith& fail);
// The hosts advertised in etcd: address, name, lease, modules held.
int ListHosts(Client& client, bool as_json, const FailWith& fail);

}  // namespace kreg

#endif  // KREGD_CLIENT_KREGCTL_CLUSTER_H_
