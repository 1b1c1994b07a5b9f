// Unit tests of the header-only API layer and the FunctionRegistry that need no runtime:
// registration, invocation round trips, serialization of refs and handles, option checks, and
// that the Ray spellings resolve. Nothing here calls Init(), so GetRuntime() is null throughout
// and ObjectRefs count no references.
#include <gtest/gtest.h>
#include <ray/api.h>

#include "common/env_key.h"
#include "core/ray_flags.h"

#include <any>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using torus::internal::ArgView;
using torus::internal::FunctionRegistry;
using torus::internal::Serializer;
using torus::internal::TaskArg;

// ---- remote functions under test ----

int Plus(int x, int y) { return x + y; }

int void_calls = 0;
void Touch(int times) { void_calls += times; }

std::string Join(const std::vector<std::string>& parts, std::string separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

struct Person {
  std::string name;
  int age = 0;
  MSGPACK_DEFINE(name, age);
};
Person Birthday(Person person) {
  ++person.age;
  return person;
}

int Overloaded(int x) { return x * 10; }
std::string Overloaded(std::string s) { return s + "!"; }

int Unregistered(int x) { return x; }

size_t IdLength(ray::ObjectRef<int> ref) { return ref.ID().size(); }

RAY_REMOTE(Plus, Touch, Join)
RAY_REMOTE(Birthday, RAY_FUNC(Overloaded, int), RAY_FUNC( Overloaded , std::string ), IdLength);

class Counter {
 public:
  static int live_instances;
  explicit Counter(int start) : count_(start) { ++live_instances; }
  ~Counter() { --live_instances; }

  static Counter* FactoryCreate() { return new Counter(0); }
  static Counter* FactoryCreate(int start) { return new Counter(start); }

  int Add(int x) { return count_ += x; }
  int Get() const { return count_; }
  void Reset() { count_ = 0; }
  ray::ActorHandle<Counter> Self(std::string id) { return ray::ActorHandle<Counter>(id); }

 private:
  int count_;
};
int Counter::live_instances = 0;

RAY_REMOTE(RAY_FUNC(Counter::FactoryCreate), RAY_FUNC(Counter::FactoryCreate, int),
           &Counter::Add, &Counter::Get, &Counter::Reset, &Counter::Self);

// Pointers to the first virtual function of unrelated classes have the same bytes.
class Shape {
 public:
  virtual ~Shape() = default;
  virtual int Sides() { return 0; }
};
class Animal {
 public:
  virtual ~Animal() = default;
  virtual int Legs() { return 4; }
};
RAY_REMOTE(&Shape::Sides, &Animal::Legs);

// A header can carry RAY_REMOTE and be included in many translation units: registering the
// same function under the same name twice must be harmless.
RAY_REMOTE(Plus);

// ---- helpers ----

template <typename... Args>
std::vector<std::string> PackAll(const Args&... args) {
  return {Serializer::Serialize(args)...};
}

std::vector<ArgView> Views(const std::vector<std::string>& packed) {
  std::vector<ArgView> views;
  for (const std::string& bytes : packed) views.push_back(ArgView{bytes.data(), bytes.size()});
  return views;
}

template <typename T>
T Unpack(const std::string& bytes) {
  return Serializer::Deserialize<T>(bytes.data(), bytes.size());
}

std::string CallFunction(const std::string& name, const std::vector<std::string>& args) {
  const torus::internal::FunctionInvoker* invoker = FunctionRegistry::Instance().FindFunction(name);
  if (invoker == nullptr) throw std::runtime_error("not registered: " + name);
  return (*invoker)(Views(args));
}

// ---- registration and invocation ----

TEST(RegistryTest, PlusRoundTrip) {
  EXPECT_EQ(Unpack<int>(CallFunction("Plus", PackAll(1, 2))), 3);
}

TEST(RegistryTest, VoidFunctionReturnsNil) {
  void_calls = 0;
  std::string result = CallFunction("Touch", PackAll(4));
  EXPECT_EQ(void_calls, 4);
  msgpack::object_handle handle = msgpack::unpack(result.data(), result.size());
  EXPECT_TRUE(handle.get().is_nil());
}

TEST(RegistryTest, VectorAndStringParameters) {
  std::vector<std::string> parts = {"a", "b", "c"};
  EXPECT_EQ(Unpack<std::string>(CallFunction("Join", PackAll(parts, std::string("-")))),
            "a-b-c");
}

TEST(RegistryTest, UserStructWithMsgpackDefine) {
  Person result = Unpack<Person>(CallFunction("Birthday", PackAll(Person{"ada", 36})));
  EXPECT_EQ(result.name, "ada");
  EXPECT_EQ(result.age, 37);
}

TEST(RegistryTest, OverloadsViaRayFuncHaveNormalisedNames) {
  EXPECT_EQ(Unpack<int>(CallFunction("RAY_FUNC(Overloaded,int)", PackAll(4))), 40);
  EXPECT_EQ(Unpack<std::string>(
                CallFunction("RAY_FUNC(Overloaded,std::string)", PackAll(std::string("hi")))),
            "hi!");
  EXPECT_EQ(torus::internal::RemoteNameOf(RAY_FUNC(Overloaded, int)), "RAY_FUNC(Overloaded,int)");
}

TEST(RegistryTest, NamesOfRegisteredEntities) {
  EXPECT_EQ(torus::internal::RemoteNameOf(Plus), "Plus");
  EXPECT_EQ(torus::internal::RemoteNameOf(&Counter::Add), "&Counter::Add");
  EXPECT_EQ(torus::internal::RemoteNameOf(RAY_FUNC(Counter::FactoryCreate, int)),
            "RAY_FUNC(Counter::FactoryCreate,int)");
  EXPECT_EQ(FunctionRegistry::Instance().FindFunction("Counter::FactoryCreate"), nullptr);
  EXPECT_EQ(FunctionRegistry::Instance().FindFunction("NoSuchFunction"), nullptr);
}

TEST(RegistryTest, FactoryAndMethodsKeepActorState) {
  FunctionRegistry& registry = FunctionRegistry::Instance();
  const auto* factory = registry.FindFactory("RAY_FUNC(Counter::FactoryCreate,int)");
  const auto* add = registry.FindMethod("&Counter::Add");
  const auto* get = registry.FindMethod("&Counter::Get");
  const auto* reset = registry.FindMethod("&Counter::Reset");
  ASSERT_NE(factory, nullptr);
  ASSERT_NE(add, nullptr);
  ASSERT_NE(get, nullptr);
  ASSERT_NE(reset, nullptr);
  // Factories are not plain functions.
  EXPECT_EQ(registry.FindFunction("RAY_FUNC(Counter::FactoryCreate,int)"), nullptr);

  const int before = Counter::live_instances;
  torus::internal::ActorInstance actor = (*factory)(Views(PackAll(10)));
  ASSERT_NE(actor.ptr, nullptr);
  EXPECT_EQ(Counter::live_instances, before + 1);

  EXPECT_EQ(Unpack<int>((*add)(actor.ptr, Views(PackAll(5)))), 15);
  EXPECT_EQ(Unpack<int>((*add)(actor.ptr, Views(PackAll(1)))), 16);
  EXPECT_EQ(Unpack<int>((*get)(actor.ptr, Views({}))), 16);
  (*reset)(actor.ptr, Views({}));
  EXPECT_EQ(Unpack<int>((*get)(actor.ptr, Views({}))), 0);

  actor.deleter(actor.ptr);
  EXPECT_EQ(Counter::live_instances, before);
}

TEST(RegistryTest, ZeroArgumentFactoryOverload) {
  const auto* factory =
      FunctionRegistry::Instance().FindFactory("RAY_FUNC(Counter::FactoryCreate)");
  ASSERT_NE(factory, nullptr);
  torus::internal::ActorInstance actor = (*factory)(Views({}));
  const auto* get = FunctionRegistry::Instance().FindMethod("&Counter::Get");
  EXPECT_EQ(Unpack<int>((*get)(actor.ptr, Views({}))), 0);
  actor.deleter(actor.ptr);
}

TEST(RegistryTest, MethodReturningActorHandle) {
  Counter counter(0);
  const auto* self = FunctionRegistry::Instance().FindMethod("&Counter::Self");
  ASSERT_NE(self, nullptr);
  std::string bytes = (*self)(&counter, Views(PackAll(std::string("actor-7"))));
  EXPECT_EQ(Unpack<ray::ActorHandle<Counter>>(bytes).ID(), "actor-7");
}

TEST(RegistryTest, ObjectRefParameterReceivesNestedRef) {
  ray::ObjectRef<int> ref("0123456789abcdef0123456789abcdef@127.0.0.1:7000");
  EXPECT_EQ(Unpack<size_t>(CallFunction("IdLength", PackAll(ref))), ref.ID().size());
}

TEST(RegistryTest, VirtualMethodsOfUnrelatedClassesAreDistinct) {
  EXPECT_EQ(torus::internal::RemoteNameOf(&Shape::Sides), "&Shape::Sides");
  EXPECT_EQ(torus::internal::RemoteNameOf(&Animal::Legs), "&Animal::Legs");
  Animal animal;
  const auto* legs = FunctionRegistry::Instance().FindMethod("&Animal::Legs");
  ASSERT_NE(legs, nullptr);
  EXPECT_EQ(Unpack<int>((*legs)(&animal, Views({}))), 4);
}

TEST(RegistryTest, WrongArgumentCountIsReported) {
  try {
    CallFunction("Plus", PackAll(1));
    FAIL() << "expected an exception";
  } catch (const ray::internal::RayException& e) {
    EXPECT_NE(std::string(e.what()).find("'Plus' takes 2 argument(s) but was sent 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(RegistryTest, WrongArgumentTypeIsReported) {
  try {
    CallFunction("Plus", PackAll(std::string("one"), 2));
    FAIL() << "expected an exception";
  } catch (const ray::internal::RayException& e) {
    EXPECT_NE(std::string(e.what()).find("argument 1 of remote function 'Plus'"),
              std::string::npos)
        << e.what();
  }
}

TEST(RegistryTest, UnregisteredFunctionIsNotFound) {
  EXPECT_THROW(ray::Task(Unregistered), ray::internal::RayFunctionNotFound);
  try {
    ray::Task(Unregistered);
  } catch (const ray::internal::RayFunctionNotFound& e) {
    EXPECT_NE(std::string(e.what()).find("RAY_REMOTE"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("int (*)(int)"), std::string::npos) << e.what();
  }
}

TEST(RegistryTest, ConflictingRegistrationsThrow) {
  FunctionRegistry& registry = FunctionRegistry::Instance();
  auto noop = [](const std::vector<ArgView>&) { return std::string(); };
  registry.RegisterFunction("test-key-1", "ConflictTestA", noop);
  registry.RegisterFunction("test-key-1", "ConflictTestA", noop);  // same again: fine
  EXPECT_THROW(registry.RegisterFunction("test-key-1", "ConflictTestB", noop),
               ray::internal::RayException);
  EXPECT_THROW(registry.RegisterFunction("test-key-2", "ConflictTestA", noop),
               ray::internal::RayException);
  // Names are one namespace across functions, factories and methods.
  EXPECT_THROW(registry.RegisterMethod("test-key-3", "ConflictTestA",
                                       [](void*, const std::vector<ArgView>&) {
                                         return std::string();
                                       }),
               ray::internal::RayException);
}

TEST(RegistryTest, SplitRemoteNamesFollowsThePreprocessor) {
  using torus::internal::SplitRemoteNames;
  EXPECT_EQ(SplitRemoteNames("Plus"), std::vector<std::string>({"Plus"}));
  EXPECT_EQ(SplitRemoteNames("RAY_FUNC( Counter::FactoryCreate , int, int ), &Counter::Add"),
            std::vector<std::string>(
                {"RAY_FUNC(Counter::FactoryCreate,int,int)", "&Counter::Add"}));
  EXPECT_EQ(SplitRemoteNames("RAY_FUNC(F, unsigned  int)"),
            std::vector<std::string>({"RAY_FUNC(F,unsigned int)"}));
}

// ---- arguments of Remote(...) ----

TEST(ArgumentsTest, ValuesArePackedAsTheParameterType) {
  using F = decltype(&Join);
  std::vector<TaskArg> args =
      torus::internal::WrapArgs<F>(std::vector<std::string>{"x", "y"}, "+");  // const char*
  ASSERT_EQ(args.size(), 2u);
  EXPECT_FALSE(args[1].is_ref);
  EXPECT_EQ(Unpack<std::string>(args[1].value), "+");
}

TEST(ArgumentsTest, ObjectRefForValueParameterIsPassedByReference) {
  ray::ObjectRef<int> ref("abc@host:1");
  std::vector<TaskArg> args = torus::internal::WrapArgs<decltype(&Plus)>(ref, 10);
  ASSERT_EQ(args.size(), 2u);
  EXPECT_TRUE(args[0].is_ref);
  EXPECT_EQ(args[0].ref_id, "abc@host:1");
  EXPECT_FALSE(args[1].is_ref);
  EXPECT_EQ(Unpack<int>(args[1].value), 10);
}

TEST(ArgumentsTest, ObjectRefForObjectRefParameterIsNested) {
  ray::ObjectRef<int> ref("abc@host:1");
  std::vector<TaskArg> args = torus::internal::WrapArgs<decltype(&IdLength)>(ref);
  ASSERT_EQ(args.size(), 1u);
  EXPECT_FALSE(args[0].is_ref);
  EXPECT_EQ(Unpack<ray::ObjectRef<int>>(args[0].value).ID(), "abc@host:1");
}

TEST(ArgumentsTest, MemberFunctionParametersSkipThis) {
  std::vector<TaskArg> args = torus::internal::WrapArgs<decltype(&Counter::Add)>(3);
  ASSERT_EQ(args.size(), 1u);
  EXPECT_EQ(Unpack<int>(args[0].value), 3);
}

TEST(ArgumentsTest, EmptyObjectRefArgumentIsRejected) {
  ray::ObjectRef<int> empty;
  EXPECT_THROW(torus::internal::WrapArgs<decltype(&Plus)>(empty, 1), ray::internal::RayException);
}

// Call sites that must not compile (wrong arity, wrong type) are checked by static_assert in
// WrapArgs; these are the positive half of that check.
static_assert(torus::internal::ArgFits<int, ray::ObjectRef<int>&>());
static_assert(torus::internal::ArgFits<double, ray::ObjectRef<int>>());
static_assert(!torus::internal::ArgFits<int, ray::ObjectRef<double>>());
static_assert(!torus::internal::ArgFits<int, ray::ObjectRef<std::string>>());
static_assert(torus::internal::ArgFits<const std::string&, const char (&)[3]>());
static_assert(torus::internal::ArgFits<ray::ObjectRef<int>, ray::ObjectRef<int>&>());
static_assert(!torus::internal::ArgFits<ray::ObjectRef<int>, ray::ObjectRef<long>&>());

// ---- serialization of refs and handles ----

TEST(ObjectRefTest, MsgpackRoundTripWithoutRuntime) {
  ASSERT_EQ(torus::internal::GetRuntime(), nullptr);
  ray::ObjectRef<int> ref("0123456789abcdef0123456789abcdef@10.0.0.1:6380");
  std::string bytes = Serializer::Serialize(ref);
  // An ext object of the ObjectRef type, so a runtime can find refs inside values.
  msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  ASSERT_EQ(handle.get().type, msgpack::type::EXT);
  EXPECT_EQ(handle.get().via.ext.type(), torus::internal::kObjectRefExtType);
  EXPECT_EQ(Unpack<ray::ObjectRef<int>>(bytes).ID(), ref.ID());
}

TEST(ObjectRefTest, VectorOfRefsAndNestedRefs) {
  std::vector<ray::ObjectRef<std::string>> refs = {ray::ObjectRef<std::string>("a@h:1"),
                                                   ray::ObjectRef<std::string>("b@h:1")};
  auto back = Unpack<std::vector<ray::ObjectRef<std::string>>>(Serializer::Serialize(refs));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].ID(), "a@h:1");
  EXPECT_EQ(back[1].ID(), "b@h:1");

  std::map<std::string, ray::ObjectRef<int>> by_name = {{"x", ray::ObjectRef<int>("x@h:1")}};
  auto back_map =
      Unpack<std::map<std::string, ray::ObjectRef<int>>>(Serializer::Serialize(by_name));
  EXPECT_EQ(back_map.at("x").ID(), "x@h:1");
}

struct Envelope {
  ray::ObjectRef<int> payload;
  ray::ActorHandle<Counter> sender;
  std::vector<ray::ObjectRef<std::string>> attachments;
  MSGPACK_DEFINE(payload, sender, attachments);
};

TEST(ObjectRefTest, RefsAndHandlesInsideUserStructs) {
  Envelope envelope{ray::ObjectRef<int>("p@h:1"), ray::ActorHandle<Counter>("actor@h:1"),
                    {ray::ObjectRef<std::string>("a@h:1")}};
  Envelope back = Unpack<Envelope>(Serializer::Serialize(envelope));
  EXPECT_EQ(back.payload.ID(), "p@h:1");
  EXPECT_EQ(back.sender.ID(), "actor@h:1");
  ASSERT_EQ(back.attachments.size(), 1u);
  EXPECT_EQ(back.attachments[0].ID(), "a@h:1");
}

TEST(ObjectRefTest, CopyMoveAndAssign) {
  ray::ObjectRef<int> a("a@h:1");
  ray::ObjectRef<int> b = a;
  EXPECT_EQ(b.ID(), "a@h:1");
  EXPECT_TRUE(a == b);
  ray::ObjectRef<int> c = std::move(a);
  EXPECT_EQ(c.ID(), "a@h:1");
  EXPECT_TRUE(a.ID().empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  b = ray::ObjectRef<int>("b@h:1");
  EXPECT_EQ(b.ID(), "b@h:1");
  b = b;
  EXPECT_EQ(b.ID(), "b@h:1");
  ray::ObjectRef<void> done("v@h:1");
  EXPECT_EQ(Unpack<ray::ObjectRef<void>>(Serializer::Serialize(done)).ID(), "v@h:1");
}

TEST(ObjectRefTest, GetWithoutRuntimeThrows) {
  ray::ObjectRef<int> ref("a@h:1");
  EXPECT_THROW(ref.Get(), ray::internal::RayException);
  EXPECT_THROW(ray::Put(1), ray::internal::RayException);
  ray::ObjectRef<int> empty;
  EXPECT_THROW(empty.Get(), ray::internal::RayException);
}

TEST(ActorHandleTest, MsgpackRoundTrip) {
  ray::ActorHandle<Counter> handle("actor-1@h:1");
  std::string bytes = Serializer::Serialize(handle);
  msgpack::object_handle object = msgpack::unpack(bytes.data(), bytes.size());
  ASSERT_EQ(object.get().type, msgpack::type::EXT);
  EXPECT_EQ(object.get().via.ext.type(), torus::internal::kActorHandleExtType);
  EXPECT_EQ(Unpack<ray::ActorHandle<Counter>>(bytes).ID(), "actor-1@h:1");

  std::vector<ray::ActorHandle<Counter>> handles = {handle, handle};
  auto back = Unpack<std::vector<ray::ActorHandle<Counter>>>(Serializer::Serialize(handles));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].ID(), "actor-1@h:1");
  EXPECT_EQ(ray::ActorHandle<Counter>::FromBytes("actor-1@h:1").ID(), handle.ID());
}

TEST(ActorHandleTest, CallersNeedRegisteredMethodsAndARuntime) {
  ray::ActorHandle<Counter> handle("actor-1@h:1");
  auto caller = handle.Task(&Counter::Add);  // resolves the name; no runtime needed
  EXPECT_THROW(caller.Remote(1), ray::internal::RayException);
  EXPECT_THROW(ray::Actor(RAY_FUNC(Counter::FactoryCreate, int)).Remote(1),
               ray::internal::RayException);
  EXPECT_FALSE(ray::GetActor<Counter>(""));
}

// ---- options ----

TEST(OptionsTest, ResourceValidation) {
  using torus::internal::ValidateResources;
  EXPECT_NO_THROW(ValidateResources({{"CPU", 0.5}, {"GPU", 2}, {"custom", 1}}));
  EXPECT_THROW(ValidateResources({{"CPU", 0}}), ray::internal::RayException);
  EXPECT_THROW(ValidateResources({{"CPU", -1}}), ray::internal::RayException);
  EXPECT_THROW(ValidateResources({{"CPU", 1.5}}), ray::internal::RayException);
  EXPECT_THROW(ValidateResources({{"", 1}}), ray::internal::RayException);
  EXPECT_THROW(ValidateResources({{"CPU", std::nan("")}}), ray::internal::RayException);
  try {
    ValidateResources({{"GPU", 2.5}});
    FAIL() << "expected an exception";
  } catch (const ray::internal::RayException& e) {
    EXPECT_NE(std::string(e.what()).find("whole numbers"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << e.what();
  }
}

TEST(OptionsTest, RemoteValidatesResourcesBeforeSubmitting) {
  try {
    ray::Task(Plus).SetResource("CPU", 1.5).Remote(1, 2);
    FAIL() << "expected an exception";
  } catch (const ray::internal::RayException& e) {
    EXPECT_NE(std::string(e.what()).find("whole numbers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ray::Actor(RAY_FUNC(Counter::FactoryCreate)).SetResources({{"CPU", -2}}).Remote(),
               ray::internal::RayException);
  EXPECT_THROW(ray::Task(Plus).SetMaxRetries(-2), ray::internal::RayException);
  EXPECT_THROW(ray::Actor(RAY_FUNC(Counter::FactoryCreate)).SetMaxConcurrency(0),
               ray::internal::RayException);
}

// Issue 41: NaN, infinite and negative amounts are refused when Remote() is called, with the
// amount named, on every caller (cross-language ones included), before anything is submitted.
TEST(OptionsTest, NanInfiniteAndNegativeAmountsAreRefusedAtTheCall) {
  const std::vector<std::pair<double, std::string>> bad = {
      {std::nan(""), "not a number"},
      {std::numeric_limits<double>::infinity(), "infinite"},
      {-std::numeric_limits<double>::infinity(), "infinite"},
      {-1, "negative"}};
  for (const auto& item : bad) {
    const double amount = item.first;
    const std::string& words = item.second;
    auto refused = [&](const std::function<void()>& call) {
      try {
        call();
        ADD_FAILURE() << "expected an exception for " << words;
      } catch (const ray::internal::RayException& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    };
    refused([&] { ray::Task(Plus).SetResource("CPU", amount).Remote(1, 2); });
    refused([&] { ray::Actor(RAY_FUNC(Counter::FactoryCreate)).SetResource("GPU", amount).Remote(); });
    refused([&] { ray::Task(ray::PyFunction<int>{"m", "f"}).SetResource("memory", amount).Remote(); });
    refused([&] { ray::Actor(ray::PyActorClass{"m", "A"}).SetResources({{"custom", amount}}).Remote(); });
  }
}

TEST(OptionsTest, PlacementGroupTypes) {
  std::vector<std::unordered_map<std::string, double>> bundles{{{"CPU", 1}}};
  ray::PlacementGroupCreationOptions options{"pg", bundles, ray::PlacementStrategy::SPREAD};
  EXPECT_FALSE(options.detached);
  ray::PlacementGroup group("pg-id", options, ray::PlacementGroupState::CREATED);
  EXPECT_EQ(group.GetName(), "pg");
  EXPECT_EQ(group.GetStrategy(), ray::PlacementStrategy::SPREAD);
  EXPECT_EQ(group.GetState(), ray::PlacementGroupState::CREATED);
  EXPECT_THROW(group.Wait(1), ray::internal::RayException);  // no runtime hook installed
  group.SetWaitCallbak([](const std::string& id, int) { return id == "pg-id"; });
  EXPECT_TRUE(group.Wait(1));
  EXPECT_TRUE(ray::PlacementGroup().Empty());
}

// ---- RuntimeEnv ----

TEST(RuntimeEnvTest, FieldsRoundTrip) {
  ray::RuntimeEnv env;
  EXPECT_TRUE(env.Empty());
  env.Set("working_dir", "https://path/to/working_dir.zip");
  env.Set("env_vars", std::map<std::string, std::string>{{"KEY1", "value1"}});
  env.Set("retries", 3);
  env.Set("list", std::vector<std::string>{"a", "b"});
  std::string raw = R"({"packages":["requests","tensorflow"],"pip_check":false})";
  env.SetJsonStr("pip", raw);
  EXPECT_EQ(env.GetJsonStr("pip"), raw);

  ray::RuntimeEnv back = ray::RuntimeEnv::Deserialize(env.Serialize());
  EXPECT_EQ(back.Get<std::string>("working_dir"), "https://path/to/working_dir.zip");
  EXPECT_EQ((back.Get<std::map<std::string, std::string>>("env_vars").at("KEY1")), "value1");
  EXPECT_EQ(back.Get<int>("retries"), 3);
  EXPECT_EQ(back.Get<std::vector<std::string>>("list"), std::vector<std::string>({"a", "b"}));
  EXPECT_EQ(back.GetJsonStr("pip"), raw);
}

TEST(RuntimeEnvTest, ErrorsAreRuntimeEnvExceptions) {
  ray::RuntimeEnv env;
  EXPECT_THROW(env.Get<std::string>("working_dir"), ray::internal::RayRuntimeEnvException);
  env.Set("working_dir", "https://path/to/working_dir.zip");
  EXPECT_THROW(env.Get<int>("working_dir"), ray::internal::RayRuntimeEnvException);
  EXPECT_THROW(env.SetJsonStr("pip", "{123"), ray::internal::RayRuntimeEnvException);
  EXPECT_THROW(env.GetJsonStr("pip"), ray::internal::RayRuntimeEnvException);
  EXPECT_THROW(ray::RuntimeEnv::Deserialize("[1]"), ray::internal::RayRuntimeEnvException);
  EXPECT_FALSE(env.Empty());
  EXPECT_TRUE(env.Remove("working_dir"));
  EXPECT_FALSE(env.Remove("pip"));
  EXPECT_TRUE(env.Empty());
}

TEST(RuntimeEnvTest, JsonParserRejectsMalformedText) {
  using torus::internal::Json;
  EXPECT_EQ(Json::Parse(R"( {"a" : [1, 2.5, "x\n\u00e9", true, null]} )").Dump(),
            "{\"a\":[1,2.5,\"x\\n\xc3\xa9\",true,null]}");
  for (const char* bad : {"", "{", "[1,]", "{\"a\"}", "01", "\"\\x\"", "[1] 2", "nul"}) {
    EXPECT_THROW(Json::Parse(bad), std::invalid_argument) << bad;
  }
  EXPECT_THROW(Json::Parse(std::string(100000, '[')), std::invalid_argument);
  // The same depth limit as every other JSON Torus reads (common/json_limits.h): 64 levels.
  EXPECT_NO_THROW(Json::Parse(std::string(64, '[') + std::string(64, ']')));
  try {
    Json::Parse(std::string(65, '[') + std::string(65, ']'));
    ADD_FAILURE() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("JSON nested deeper than 64 levels"), std::string::npos) << e.what();
  }
}

// ---- RuntimeEnv with nlohmann::json converters (as Ray's RuntimeEnv takes them) ----

struct PipSpec {
  std::vector<std::string> packages;
  bool pip_check = false;
};
void to_json(nlohmann::json& j, const PipSpec& p) {
  j = nlohmann::json{{"packages", p.packages}, {"pip_check", p.pip_check}};
}
void from_json(const nlohmann::json& j, PipSpec& p) {
  j.at("packages").get_to(p.packages);
  j.at("pip_check").get_to(p.pip_check);
}

TEST(RuntimeEnvTest, UserTypesWithJsonConverters) {
  ray::RuntimeEnv env;
  env.Set("pip", PipSpec{{"requests", "numpy"}, true});
  EXPECT_EQ(env.GetJsonStr("pip"), R"({"packages":["requests","numpy"],"pip_check":true})");
  PipSpec back = ray::RuntimeEnv::Deserialize(env.Serialize()).Get<PipSpec>("pip");
  EXPECT_EQ(back.packages, std::vector<std::string>({"requests", "numpy"}));
  EXPECT_TRUE(back.pip_check);
  env.Set("raw", nlohmann::json{{"a", 1}});
  EXPECT_EQ(env.Get<nlohmann::json>("raw")["a"], 1);
  env.Set("retries", 3);
  EXPECT_THROW(env.Get<PipSpec>("retries"), ray::internal::RayRuntimeEnvException);
}

TEST(RuntimeEnvTest, OnlyEnvVarsAreApplied) {
  using torus::internal::EnvVarsOfSerialized;
  ray::RuntimeEnv env;
  env.Set("env_vars", std::map<std::string, std::string>{{"A", "1"}, {"B", "2"}});
  env.SetJsonStr("config", R"({"setup_timeout_seconds":10})");
  auto vars = EnvVarsOfSerialized(env.Serialize());
  EXPECT_EQ(vars, (std::map<std::string, std::string>{{"A", "1"}, {"B", "2"}}));
  EXPECT_TRUE(EnvVarsOfSerialized("").empty());
  for (const char* bad : {R"({"pip":["x"]})", R"({"env_vars":{"A":1}})", R"({"env_vars":[]})",
                          R"({"env_vars":{"A=B":"1"}})", "[]"}) {
    EXPECT_THROW(EnvVarsOfSerialized(bad), ray::internal::RayRuntimeEnvException) << bad;
  }
  // Pool keys: different variables never share a key; none adds nothing.
  EXPECT_EQ(torus::EnvVarsKey(std::map<std::string, std::string>{}), "");
  EXPECT_NE(torus::EnvVarsKey(std::map<std::string, std::string>{{"A", "1=B"}}),
            torus::EnvVarsKey(std::map<std::string, std::string>{{"A", "1"}, {"B", ""}}));
}

// ---- std::any values, as Ray packs them ----

TEST(SerializerTest, AnyRoundTripsAsRayDoes) {
  auto round = [](const auto& v) {
    std::string bytes = Serializer::Serialize(v);
    return Serializer::Deserialize<std::any>(bytes.data(), bytes.size());
  };
  EXPECT_EQ(std::any_cast<uint64_t>(round(std::any(uint64_t{7}))), 7u);
  EXPECT_EQ(std::any_cast<int64_t>(round(std::any(int64_t{-7}))), -7);
  EXPECT_EQ(std::any_cast<double>(round(std::any(1.5))), 1.5);
  EXPECT_EQ(std::any_cast<std::string>(round(std::any(std::string("s")))), "s");
  EXPECT_TRUE(std::any_cast<bool>(round(std::any(true))));
  EXPECT_EQ(std::any_cast<std::vector<char>>(round(std::any(std::vector<char>{'a', 'b'}))),
            (std::vector<char>{'a', 'b'}));
  EXPECT_EQ(round(std::any(msgpack::type::nil_t())).type(), typeid(msgpack::type::nil_t));
  EXPECT_EQ(round(42).type(), typeid(uint64_t));  // a plain int arrives as Ray's uint64_t
  EXPECT_THROW(Serializer::Serialize(std::any(42)), ray::internal::RayException);
  std::vector<std::any> list = {std::any(int64_t{-1}), std::any(std::string("x"))};
  std::string bytes = Serializer::Serialize(list);
  auto back = Serializer::Deserialize<std::vector<std::any>>(bytes.data(), bytes.size());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(std::any_cast<int64_t>(back[0]), -1);
  EXPECT_EQ(std::any_cast<std::string>(back[1]), "x");
  std::string arr = Serializer::Serialize(std::vector<int>{1});
  EXPECT_THROW(Serializer::Deserialize<std::any>(arr.data(), arr.size()), ray::internal::RayException);
}

// ---- Ray's program flags ----

torus::core::RayFlags Parse(ray::RayConfig& cfg, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return torus::core::ParseRayFlags(cfg, static_cast<int>(argv.size()), argv.data());
}

TEST(RayFlagsTest, HonouredFlagsInBothForms) {
  ray::RayConfig cfg;
  auto f = Parse(cfg, {"--ray_address=h:1", "--ray_code_search_path", "/a:/b", "-ray_namespace=ns",
                       "--ray_default_actor_lifetime", "Detached", "--ray_logs_dir=/tmp/l",
                       "--ray_head_args", "--num-cpus 2", "positional", "--other", "x"});
  EXPECT_EQ(cfg.address, "h:1");
  EXPECT_EQ(cfg.code_search_path, std::vector<std::string>({"/a", "/b"}));
  EXPECT_EQ(cfg.ray_namespace, "ns");
  EXPECT_EQ(cfg.default_actor_lifetime, ray::ActorLifetime::DETACHED);
  EXPECT_EQ(f.logs_dir, "/tmp/l");
  EXPECT_EQ(cfg.head_args, std::vector<std::string>({"--num-cpus", "2"}));
  EXPECT_TRUE(f.warnings.empty());
  Parse(cfg, {"--ray_default_actor_lifetime=non_detached"});
  EXPECT_EQ(cfg.default_actor_lifetime, ray::ActorLifetime::NON_DETACHED);
  EXPECT_THROW(Parse(cfg, {"--ray_default_actor_lifetime=forever"}), ray::internal::RayException);
  EXPECT_THROW(Parse(cfg, {"--ray_logs_dir"}), ray::internal::RayException);
}

TEST(RayFlagsTest, IgnoredFlagsWarnOneLineEach) {
  ray::RayConfig cfg;
  auto f = Parse(cfg, {"--ray_redis_password=pw", "--ray_job_id", "01000000",
                       "--ray_node_ip_address=1.2.3.4", "--startup_token=3", "--ray_bogus",
                       "keep"});
  ASSERT_EQ(f.warnings.size(), 5u);
  const char* names[] = {"--ray_redis_password", "--ray_job_id", "--ray_node_ip_address",
                         "--startup_token", "--ray_bogus"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_NE(f.warnings[i].find(names[i]), std::string::npos) << f.warnings[i];
    EXPECT_EQ(f.warnings[i].find('\n'), std::string::npos);
  }
  EXPECT_EQ(cfg.address, "");
}

// ---- Ray spellings ----

static_assert(std::is_same_v<ray::ObjectRef<int>, torus::ObjectRef<int>>);
static_assert(std::is_same_v<ray::ActorHandle<Counter>, torus::ActorHandle<Counter>>);
static_assert(std::is_same_v<ray::WaitResult<int>, torus::WaitResult<int>>);
static_assert(std::is_same_v<ray::RayConfig, torus::RayConfig>);
static_assert(std::is_same_v<ray::RuntimeEnv, torus::RuntimeEnv>);
static_assert(std::is_same_v<ray::ActorLifetime, torus::ActorLifetime>);
static_assert(std::is_same_v<ray::PlacementGroup, torus::PlacementGroup>);
static_assert(std::is_same_v<ray::PlacementGroupCreationOptions,
                             torus::PlacementGroupCreationOptions>);
static_assert(ray::PlacementStrategy::SPREAD == torus::PlacementStrategy::SPREAD);
static_assert(ray::PlacementGroupState::REMOVED == torus::REMOVED);
static_assert(std::is_same_v<ray::internal::RayException, torus::internal::RayException>);
static_assert(std::is_base_of_v<ray::internal::RayException, ray::internal::RayActorException>);
static_assert(std::is_base_of_v<ray::internal::RayException, ray::internal::RayWorkerException>);
static_assert(std::is_base_of_v<ray::internal::RayException,
                                ray::internal::UnreconstructableException>);
static_assert(std::is_base_of_v<ray::internal::RayException, ray::internal::RayTimeoutException>);
static_assert(std::is_base_of_v<std::exception, ray::internal::RayException>);
static_assert(std::is_same_v<decltype(ray::GetActor<Counter>("n")),
                             boost::optional<ray::ActorHandle<Counter>>>);
static_assert(std::is_same_v<decltype(ray::Task(Plus).Remote(1, 2)), ray::ObjectRef<int>>);
static_assert(std::is_same_v<decltype(ray::Task(Touch).Remote(1)), ray::ObjectRef<void>>);
static_assert(std::is_same_v<decltype(ray::Actor(RAY_FUNC(Counter::FactoryCreate, int)).Remote(1)),
                             ray::ActorHandle<Counter>>);
static_assert(std::is_same_v<decltype(std::declval<ray::ActorHandle<Counter>&>()
                                          .Task(&Counter::Get)
                                          .Remote()),
                             ray::ObjectRef<int>>);
static_assert(std::is_same_v<decltype(ray::Get(std::declval<ray::ObjectRef<int>&>())),
                             std::shared_ptr<int>>);
static_assert(std::is_same_v<decltype(ray::Wait(std::declval<std::vector<ray::ObjectRef<int>>&>(),
                                                1, 10)),
                             ray::WaitResult<int>>);

TEST(SpellingTest, TaskExceptionIsCaughtAsRayException) {
  try {
    throw ray::internal::RayTaskException("boom");
  } catch (const ray::internal::RayException& e) {
    EXPECT_EQ(e.msg_, "boom");
    EXPECT_STREQ(e.what(), "boom");
  }
}

TEST(SpellingTest, RayLogCompilesAndBindsElseCorrectly) {
  bool else_taken = false;
  if (false)
    RAYLOG(DEBUG) << "never";
  else
    else_taken = true;
  EXPECT_TRUE(else_taken);
  RAYLOG(INFO) << "api_test log line " << 42;
}

// CopyLarge splits big copies over helper threads: every byte must land, whatever the size's
// remainder, and nothing outside [dst, dst+n) may be touched.
TEST(CopyLargeTest, CopiesEveryByteOfOddSizes) {
  for (size_t n : {size_t{100}, ray::internal::kParallelCopyMinBytes - 1,
                   ray::internal::kParallelCopyMinBytes, ray::internal::kParallelCopyMinBytes + 13,
                   size_t{3} * ray::internal::kParallelCopyMinBytes + 1}) {
    std::vector<char> src(n), dst(n + 128, '\x5a');
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<char>((i * 2654435761u) >> 13);
    ray::internal::CopyLarge(dst.data() + 64, src.data(), n);
    EXPECT_EQ(std::memcmp(dst.data() + 64, src.data(), n), 0) << "size " << n;
    for (size_t i = 0; i < 64; ++i) {
      ASSERT_EQ(dst[i], '\x5a') << "byte before the destination, size " << n;
      ASSERT_EQ(dst[n + 64 + i], '\x5a') << "byte after the destination, size " << n;
    }
  }
}

}  // namespace
