/* C ABI of the planner (libstreamalloc_planner.so), for ctypes and other languages. */
#ifndef STREAMALLOC_PLANNER_H
#define STREAMALLOC_PLANNER_H

#ifdef __cplusplus
extern "C" {
#endif

/* Plan `events` (a path to an event list, or the list itself when it starts with '#') under the
 * settings of `request_json` (plan.hpp, parse_request; NULL or "" for the defaults). Returns a
 * malloc'd JSON string: the report, or {"error": "one line"} when the input or a setting is bad.
 * Free it with streamalloc_plan_free(). Never throws. */
char* streamalloc_plan_json(const char* events, const char* request_json);
void streamalloc_plan_free(char* text);

#ifdef __cplusplus
}
#endif

#endif
