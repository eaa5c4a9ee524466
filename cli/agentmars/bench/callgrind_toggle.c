/* Callgrind's client requests for agentmars bench plugin --instructions (outside
 * valgrind they do nothing): instrumentation on from the first counted pass (vLLM's
 * import runs uninstrumented, several times faster; when already on, nothing),
 * collection on or off around each schedule(), and a dump of what was collected since
 * the last, named after the scheduler that ran. */
#include <valgrind/callgrind.h>

void agentmars_start_instrumentation(void) { CALLGRIND_START_INSTRUMENTATION; }

void agentmars_toggle_collect(void) { CALLGRIND_TOGGLE_COLLECT; }

void agentmars_dump_stats(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
