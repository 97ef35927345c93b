// Test helpers: a LaunchSpec (launch_spec.proto) as a launch descriptor, the
// bytes a launch-ring slot or a socket Launch carries.
#ifndef KREGD_TESTS_TESTING_LAUNCH_SPEC_H_
#define KREGD_TESTS_TESTING_LAUNCH_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/ring_encode.h"
#include "kreg/v1/session.pb.h"
#include "tests/testing/launch_spec.pb.h"

namespace kreg {
namespace testing {

// The attribute bytes of `l` (a kreg.v1.AttributeBlock).
inline std::string AttrBytes(const LaunchSpec& l) {
  v1::AttributeBlock block;
  *block.mutable_attrs() = l.attrs();
  return block.SerializeAsString();
}

// The descriptor of `l`, with `seq`, `tag` and ring::kSubmit* `flags`.
inline std::string EncodeSpec(const LaunchSpec& l, uint32_t seq = 0,
                              uint64_t tag = 0, uint32_t flags = 0) {
  const std::string attrs = AttrBytes(l);
  std::vector<ring::BufferView> views;
  for (const auto* list : {&l.args(), &l.rets()}) {
    for (const BufferSpec& b : *list) {
      views.push_back(
          ring::BufferView{b.dtype(), static_cast<uint32_t>(b.dims_size()),
                           b.dims().data(), b.offset(), b.size(),
                           ring::CudaRef{b.cuda().base(), b.cuda().size(),
                                         b.cuda().generation()}});
    }
  }
  ring::DescriptorView d;
  d.target = l.target_name();
  d.platform = l.platform();
  d.args = views.data();
  d.num_args = static_cast<uint32_t>(l.args_size());
  d.rets = views.data() + l.args_size();
  d.num_rets = static_cast<uint32_t>(l.rets_size());
  d.attrs = attrs;
  d.run_id = l.run_id();
  d.device_ordinal = l.device_ordinal();
  d.device_uuid = l.device_uuid();
  d.doorbell_seq = l.doorbell_seq();
  d.flags = flags;
  d.generation = l.generation();
  d.state = l.state();
  std::string out(ring::DescriptorBytes(d), '\0');
  ring::EncodeDescriptor(d, seq, tag, out.data(), out.size());
  return out;
}

// A session request `id` launching `l` on the socket.
inline v1::SessionRequest LaunchRequest(const LaunchSpec& l, uint64_t id) {
  v1::SessionRequest r;
  r.set_id(id);
  r.mutable_launch()->set_descriptor(EncodeSpec(l));
  return r;
}

}  // namespace testing
}  // namespace kreg

#endif  // KREGD_TESTS_TESTING_LAUNCH_SPEC_H_
