// kregctl's cluster-mode commands: `list --cluster` and `hosts`.
#ifndef KREGD_CLIENT_KREGCTL_CLUSTER_H_
#define KREGD_CLIENT_KREGCTL_CLUSTER_H_

#include "client/client.h"

namespace kreg {

// Every binding in etcd (a table with the registering host, or JSON).
// Returns the exit code; errors go through Fail (kregctl_common.h).
int ListCluster(Client& client, bool as_json);
// The hosts advertised in etcd: address, name, lease, modules held.
int ListHosts(Client& client, bool as_json);

}  // namespace kreg

#endif  // KREGD_CLIENT_KREGCTL_CLUSTER_H_
