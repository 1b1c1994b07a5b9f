// Torus: a distributed task and actor runtime whose C++ API is source-compatible with Ray's.
// Include this header (or <ray/api.h> to use the ray:: spellings) and link libtorus.
//
//   #include <torus/api.h>
//
//   int Plus(int x, int y) { return x + y; }
//   RAY_REMOTE(Plus);
//
//   class Counter {
//    public:
//     static Counter* Create(int start) { return new Counter{start}; }
//     int Add(int x) { return count += x; }
//     int count;
//   };
//   RAY_REMOTE(Counter::Create, &Counter::Add);
//
//   int main() {
//     torus::Init();
//     torus::ObjectRef<int> sum = torus::Task(Plus).Remote(1, 2);
//     auto counter = torus::Actor(Counter::Create).Remote(10);
//     int total = *counter.Task(&Counter::Add).Remote(sum).Get();   // 13
//     torus::Shutdown();
//   }
//
// Where things are:
//   torus/api/init.h             Init, Shutdown, IsInitialized, GetNamespace
//   torus/api/config.h           RayConfig, ActorLifetime
//   torus/api/remote.h           RAY_REMOTE (registration); overload.h: RAY_FUNC
//   torus/api/object_ref.h       ObjectRef<T>
//   torus/api/object_store.h     Put, Get, Wait (wait_result.h: WaitResult<T>)
//   torus/api/cancel.h           Cancel (Torus extension)
//   torus/api/task_caller.h      Task(f).Remote(...)
//   torus/api/actor.h            Actor(factory), ActorHandle<T>, GetActor, ExitActor
//   torus/api/placement_group.h  placement groups
//   torus/api/runtime_env.h      RuntimeEnv
//   torus/api/exceptions.h       RayException and the errors Get and Remote throw
//   torus/api/logging.h          RAYLOG(level)
//   torus/api/serializer.h       how values are encoded (msgpack)
#pragma once

#include "torus/api/actor.h"
#include "torus/api/arguments.h"
#include "torus/api/cancel.h"
#include "torus/api/config.h"
#include "torus/api/exceptions.h"
#include "torus/api/init.h"
#include "torus/tpu.h"
#include "torus/api/invoker.h"
#include "torus/api/logging.h"
#include "torus/api/object_ref.h"
#include "torus/api/object_store.h"
#include "torus/api/overload.h"
#include "torus/api/placement_group.h"
#include "torus/api/remote.h"
#include "torus/api/runtime_env.h"
#include "torus/api/serializer.h"
#include "torus/api/task_caller.h"
#include "torus/api/task_options.h"
#include "torus/api/type_traits.h"
#include "torus/api/wait_result.h"
#include "torus/api/xlang.h"
