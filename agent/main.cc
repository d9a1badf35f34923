// tandem-agent: see agent_server.h for what it serves, agent_config.h for
// how it is configured and agent_main.h for how the process runs.

#include "agent/agent_main.h"

int main(int argc, char** argv) { return tandem::agent::runAgent(argc, argv); }
