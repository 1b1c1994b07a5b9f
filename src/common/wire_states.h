// The text of the wire schema's state enums (proto/torus.proto): the one place that turns a
// state into what users see (`torus list`, `torus job`, the Python and C++ APIs) and back.
// The text is what these fields held when they were strings: the enum value's name for tasks,
// placement groups, actors, jobs and job processes ("ALIVE", "CREATED": Ray's spelling), the
// name in lower case for slices and workers ("free", "idle"). docs/cli.md lists them.
// Pure functions, thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "proto/torus.pb.h"

namespace torus {

// A state's text; "" for a number no value of the enum has (a newer peer's state).
const std::string& StateName(rpc::TaskInfo::State s);
const std::string& StateName(rpc::PlacementGroupRecord::State s);
const std::string& StateName(rpc::SliceSummary::State s);
const std::string& StateName(rpc::WorkerInfo::State s);
const std::string& StateName(rpc::ActorRecord::State s);
const std::string& StateName(rpc::JobProcessInfo::State s);
const std::string& StateName(rpc::JobRecord::State s);

// The inverse of StateName: exactly its text (case matters), else InvalidArgument naming the
// text and every valid one ("unknown actor state "LIVE" (one of PENDING, ALIVE, ...)").
// *out is left alone on an error.
Status ParseState(std::string_view text, rpc::TaskInfo::State* out);
Status ParseState(std::string_view text, rpc::PlacementGroupRecord::State* out);
Status ParseState(std::string_view text, rpc::SliceSummary::State* out);
Status ParseState(std::string_view text, rpc::WorkerInfo::State* out);
Status ParseState(std::string_view text, rpc::ActorRecord::State* out);
Status ParseState(std::string_view text, rpc::JobProcessInfo::State* out);
Status ParseState(std::string_view text, rpc::JobRecord::State* out);

// A job in one of these states has ended: SUCCEEDED, FAILED, STOPPED.
bool IsTerminal(rpc::JobRecord::State s);

}  // namespace torus
