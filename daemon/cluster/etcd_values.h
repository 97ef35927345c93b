// What etcd's v3 API answers, as kregd's etcd client returns it: a
// key-value with its revisions, a range, a create's outcome, a watch event.
#ifndef KREGD_DAEMON_CLUSTER_ETCD_VALUES_H_
#define KREGD_DAEMON_CLUSTER_ETCD_VALUES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kreg {

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
  // Writes of the key since its creation (1: the creating one); with
  // create_revision, the record's place in the key's history.
  int64_t version = 0;
};

struct EtcdRange {
  std::vector<EtcdKv> kvs;
  int64_t revision = 0;  // the store revision the range was read at
};

// The outcome of CreateIfAbsent: created, or the key's current value.
struct EtcdCreate {
  bool created = false;
  EtcdKv existing;  // when !created
  // The store revision after the transaction: when created, the key's
  // create_revision (and mod_revision).
  int64_t revision = 0;
};

struct EtcdEvent {
  bool deleted = false;  // false: a put
  EtcdKv kv;             // for a delete, only key and mod_revision
  EtcdKv prev;           // the value before the event, when etcd has it
};

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_ETCD_VALUES_H_
