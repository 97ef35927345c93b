// How kregd and kregd-exec format their log lines: timestamped text on a
// terminal or in a file; under journald (stderr is the stream systemd
// names in $JOURNAL_STREAM) each line starts with its syslog priority
// ("<4>" for a warning), so `journalctl -p warning` finds kregd's warnings,
// and without a timestamp of its own (journald keeps one).
#ifndef KREGD_DAEMON_BASE_LOG_FORMAT_H_
#define KREGD_DAEMON_BASE_LOG_FORMAT_H_

#include <string>

namespace kreg {

// True when stderr is the journal stream systemd passed ($JOURNAL_STREAM
// is "<device>:<inode>" of stderr).
bool StderrIsJournal();

// Sets the default logger's format: "<time> <level> <ident>[<pid>] <msg>",
// or "<N><level> <ident>[<pid>] <msg>" when StderrIsJournal(). `ident` may
// carry more (e.g. "kregd-exec[%P] (uid 1000)" needs ident "kregd-exec"
// and `suffix` " (uid 1000)").
void SetLogFormat(const std::string& ident, const std::string& suffix = "");

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_LOG_FORMAT_H_
