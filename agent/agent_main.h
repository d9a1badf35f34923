#pragma once
// The tandem-agent process: flags, logging, signals, port file, drain on
// SIGTERM. main.cc is only this; the fault-injecting test build of the agent
// (tests/agent/faults/) runs the same with its own KV transport.

#include "agent/transport/kv_transport.h"

namespace tandem::agent {

// Exits 0 after a graceful drain on SIGTERM or SIGINT, 2 on bad
// configuration, 1 when start-up fails. `program hash-api-key --name NAME`
// instead prints the API keys file's entry for the key on stdin
// (docs/api-keys.md). `kv_transport_factory`: see
// AgentServer::start. `program` names the binary in messages.
int runAgent(int argc, char** argv, transport::KvTransportFactory kv_transport_factory = {},
             const char* program = "tandem-agent");

}  // namespace tandem::agent
