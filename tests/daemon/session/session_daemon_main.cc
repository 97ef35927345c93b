// A stand-in kregd for session tests: the real store, loader, journal,
// registry, registrar, FFI host and session server, without gRPC. Flags as
// kregd's: --socket S --state-dir D --allow-root R (repeatable)
// [--probe P]. Serves sessions on S.session until SIGTERM/SIGINT.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "daemon/ffi/ffi_host.h"
#include "daemon/journal.h"
#include "daemon/module_loader.h"
#include "daemon/module_store.h"
#include "daemon/registrar.h"
#include "daemon/registry.h"
#include "daemon/session/session_server.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  std::string socket, state, probe;
  std::vector<std::string> roots;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--socket")
      socket = argv[i + 1];
    else if (k == "--state-dir")
      state = argv[i + 1];
    else if (k == "--allow-root")
      roots.push_back(argv[i + 1]);
    else if (k == "--probe")
      probe = argv[i + 1];
  }
  if (socket.empty() || state.empty()) {
    std::cerr << "usage: session_daemon --socket S --state-dir D "
                 "[--allow-root R] [--probe P]\n";
    return 2;
  }
  if (probe.empty()) {
    std::string self(argv[0]);
    probe = self.substr(0, self.rfind('/') + 1) + "../../../daemon/kregd-probe";
  }
  spdlog::set_default_logger(spdlog::default_logger());
  ::mkdir(state.c_str(), 0700);
  kreg::ModuleStore store(state + "/modules");
  if (auto s = store.Init(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  kreg::ModuleLoader loader(&store, probe);
  kreg::Journal journal(state + "/journal");
  auto entries = journal.Open();
  if (!entries.ok()) {
    std::cerr << entries.status() << "\n";
    return 1;
  }
  kreg::Registry registry(&loader, &journal);
  for (const auto& e : *entries) {
    if (auto s = registry.Restore(e); !s.ok()) std::cerr << s << "\n";
  }
  kreg::Registrar registrar(&registry, kreg::ModulePolicy{roots});
  kreg::FfiHost host;
  kreg::SessionOptions opts;
  opts.socket_path = socket + ".session";
  kreg::SessionServer server(opts, &registrar, &registry, &host);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (auto s = server.Start(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  server.Stop();
  return 0;
}
