# tether build. Sources are discovered by folder, so adding a file needs no
# Makefile edit:
#   lib/*.c            -> build/libtethercore.a (shared core)
#   src/<role>/*.c     -> build/tetherd (one binary, one role per folder)
#   src/bridge/*.c     -> build/tether-bridge (lean: exec'd per execution)
#   src/signer/*.c     -> build/tether-signer (lean: the only key holder)
#   src/cli/*.c        -> build/tether (CLI; src/client/*.c is libtether)
#   src/guest/*.c      -> build/tether-guest (static)
#   tests/unit/test_*.c, fuzz/fuzz_*.c, bench/bench_*.c -> one binary each
#   tests/churn/churn.c -> build/churn (the churn proof suite, issue 12)
CC      ?= gcc
BUILD   ?= build
SAN     ?=
PKGS    := libsodium jansson libwebsockets libuv libcurl sqlite3 libpq libseccomp
WARN    := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wmissing-prototypes \
           -Wstrict-prototypes
CFLAGS  ?= -O2 -g
override CFLAGS += -std=c17 -D_GNU_SOURCE $(WARN) -Ilib -Isrc -MMD -MP $(SAN) \
           $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread
LDFLAGS += $(SAN)

LIB_SRC    := $(wildcard lib/*.c)
CLIENT_SRC := $(wildcard src/client/*.c)
ROLE_SRC   := $(wildcard src/tetherd/*.c src/cp/*.c src/edge/*.c src/node/*.c \
                         src/manager/*.c src/substrate/*.c src/substrate/ns/*.c src/substrate/microvm/*.c \
                         src/gateway/*.c)
BRIDGE_SRC := $(wildcard src/bridge/*.c)
SIGNER_SRC := $(wildcard src/signer/*.c)
CLI_SRC    := $(wildcard src/cli/*.c)
GUEST_SRC  := $(wildcard src/guest/*.c)
TEST_SRC   := $(wildcard tests/unit/test_*.c)
BENCH_SRC  := $(wildcard bench/bench_*.c)
FUZZ_SRC   := $(wildcard fuzz/fuzz_*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
CORE    := $(BUILD)/libtethercore.a
CLIENT  := $(BUILD)/libtether.a
TESTS   := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
BINS    := $(BUILD)/tetherd $(BUILD)/tether $(if $(GUEST_SRC),$(BUILD)/tether-guest) \
           $(if $(BRIDGE_SRC),$(BUILD)/tether-bridge) $(BUILD)/tether-signer $(BUILD)/churn \
           $(BUILD)/tether-vm-assets

.PHONY: all deps run check unit bench fuzz churn crash clean
all: deps-quiet $(BINS) $(TESTS) $(BENCHES)

deps:
	@scripts/deps.sh
deps-quiet:
	@scripts/deps.sh --quiet

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(CORE): $(call obj,$(LIB_SRC))
	@rm -f $@; ar rcs $@ $^
$(CLIENT): $(call obj,$(CLIENT_SRC) $(LIB_SRC))
	@rm -f $@; ar rcs $@ $^

# Role modules (all but main.c) also go in a library, so unit tests can
# exercise them directly.
ROLES   := $(BUILD)/libtetherroles.a
$(ROLES): $(call obj,$(filter-out src/tetherd/main.c,$(ROLE_SRC)))
	@rm -f $@; ar rcs $@ $^
$(BUILD)/tetherd: $(call obj,src/tetherd/main.c) $(ROLES) $(CORE)
	$(CC) $(LDFLAGS) -o $@ -Wl,--whole-archive $(ROLES) -Wl,--no-whole-archive $(call obj,src/tetherd/main.c) $(CORE) $(LDLIBS)
$(BUILD)/tether: $(call obj,$(CLI_SRC)) $(CLIENT) $(CORE)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
# The host bridge is exec'd once per execution on the create path: only the
# libraries it uses (the linker takes just the lib/ objects it needs from
# the core archive), so exec + dynamic linking stays cheap.
BRIDGE_LIBS := $(shell pkg-config --libs libuv libsodium jansson 2>/dev/null) -lpthread
$(BUILD)/tether-bridge: $(call obj,$(BRIDGE_SRC)) $(CORE)
	$(CC) $(LDFLAGS) -o $@ $(call obj,$(BRIDGE_SRC)) $(CORE) $(BRIDGE_LIBS)
# The signer holds the private keys: libsodium, jansson, libseccomp and the
# lib/ objects it uses (wire, claims, paseto, paserk); nothing else. Its
# modules but main.c also go in a library for tests (signing feed updates).
SIGNER_LIBS := $(shell pkg-config --libs libsodium jansson libseccomp 2>/dev/null)
SIGNERLIB   := $(BUILD)/libtethersigner.a
$(SIGNERLIB): $(call obj,$(filter-out src/signer/main.c,$(SIGNER_SRC)))
	@rm -f $@; ar rcs $@ $^
$(BUILD)/tether-signer: $(call obj,$(SIGNER_SRC)) $(CORE)
	$(CC) $(LDFLAGS) -o $@ $(call obj,$(SIGNER_SRC)) $(CORE) $(SIGNER_LIBS)
# The guest agent runs inside sandboxes with no host libraries: static, and
# built from its own objects (no sanitizers: they need a runtime).
$(BUILD)/tether-guest: $(GUEST_SRC) $(wildcard src/guest/*.h) $(LIB_SRC) $(wildcard lib/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c17 -D_GNU_SOURCE -O2 -g $(WARN) -Ilib -Isrc -static -o $@ \
	  $(GUEST_SRC) $(filter lib/wire.c lib/wire_json.c lib/wirecode.c lib/wireop.c lib/hello.c lib/err.c lib/log.c lib/fsutil.c lib/mux.c,$(LIB_SRC)) -l:libsodium.a -l:libjansson.a

# The microVM asset builder, next to tetherd (the manager runs it).
$(BUILD)/tether-vm-assets: src/substrate/microvm/tether-vm-assets.sh
	@mkdir -p $(dir $@)
	install -m 0755 $< $@

# The churn harness is a plain client of the edge's HTTP API: libcurl,
# jansson and threads only.
CHURN_LIBS := $(shell pkg-config --libs libcurl jansson 2>/dev/null) -lpthread -lm
$(BUILD)/churn: tests/churn/churn.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(CHURN_LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(ROLES) $(SIGNERLIB) $(CLIENT) $(CORE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.a,$^) $(LDLIBS) -lcmocka
$(BUILD)/bench/%: bench/%.c $(ROLES) $(CLIENT) $(CORE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.a,$^) $(LDLIBS)

# Fuzzers: libFuzzer + ASan/UBSan under clang, one per parser. The core is
# compiled once into an archive (instrumented, without libFuzzer's main);
# each fuzzer links its harness, the role file that holds its parser, and
# what it needs from the archive.
FUZZ_SAN    := address,undefined
FUZZ_CFLAGS := -std=c17 -D_GNU_SOURCE -g -O1 -Ilib -Isrc -MMD -MP \
  $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
FUZZ_CORE   := build-fuzz/libfuzzcore.a
fuzzobj = $(patsubst %.c,build-fuzz/obj/%.o,$(1))
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,$(FUZZ_SAN) -c $< -o $@
$(FUZZ_CORE): $(call fuzzobj,$(LIB_SRC))
	@rm -f $@; ar rcs $@ $^
build-fuzz/%: build-fuzz/obj/fuzz/%.o $(FUZZ_CORE)
	clang -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $^ $(LDLIBS)
# The CLI's config parser lives in the client library.
build-fuzz/fuzz_config: $(call fuzzobj,fuzz/fuzz_config.c src/client/config.c) $(FUZZ_CORE)
	clang -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $^ $(LDLIBS)
# The manager's feed decoder, fed envelopes signed by the signer's code.
build-fuzz/fuzz_feed: $(call fuzzobj,fuzz/fuzz_feed.c src/signer/sign.c) $(FUZZ_CORE)
	clang -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $^ $(LDLIBS)
# A spare bridge's assignment parser lives with the bridge.
build-fuzz/fuzz_assign: $(call fuzzobj,fuzz/fuzz_assign.c src/bridge/args.c) $(FUZZ_CORE)
	clang -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $^ $(LDLIBS)
# A spare agent's assignment parser lives with the agent.
build-fuzz/fuzz_guest_assign: $(call fuzzobj,fuzz/fuzz_guest_assign.c src/guest/assign.c) $(FUZZ_CORE)
	clang -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $^ $(LDLIBS)
# The manager's QMP line decoder lives with the microvm substrate.
build-fuzz/fuzz_qmp: $(call fuzzobj,fuzz/fuzz_qmp.c src/substrate/microvm/qmp.c) $(FUZZ_CORE)
	clang -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $^ $(LDLIBS)
-include $(shell find build-fuzz/obj -name '*.d' 2>/dev/null)
fuzzers: $(patsubst fuzz/%.c,build-fuzz/%,$(FUZZ_SRC))

unit: all
	@scripts/run-tests.sh unit $(BUILD)

# All tests: unit, unit again under ASan+UBSan, fuzzers briefly on their
# corpus, then integration tests against real daemons.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
check: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=build-asan \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  CFLAGS="-O1 -g" build-asan/libtethercore.a build-asan/libtether.a build-asan/libtetherroles.a \
	  build-asan/libtethersigner.a \
	  $(patsubst tests/unit/%.c,build-asan/tests/%,$(TEST_SRC))
	@$(MAKE) --no-print-directory -j$(JOBS) fuzzers
	@scripts/run-tests.sh all

bench: all
	@for b in $(BENCHES); do echo "== $$b"; $$b || exit 1; done

fuzz: deps fuzzers
	@scripts/run-fuzz.sh $${FUZZ_SECONDS:-60}

# The long churn run (issue 12): until 1,000,000 operations, or CHURN_OPS=N
# / CHURN_SECONDS=S; CHURN_ARGS are passed on to build/churn.
churn: all
	@scripts/churn.sh $(if $(CHURN_SECONDS),$(CHURN_SECONDS),--ops $(or $(CHURN_OPS),1000000)) $(CHURN_ARGS)

# The crash-safety suite (issue 12): kill -9 each daemon in turn under churn
# load, CRASH_ROUNDS rounds (default 3; ~2 min each); docs/RESULTS.md.
crash: all
	@scripts/crash.sh $(or $(CRASH_ROUNDS),3)

run: deps
	@$(MAKE) --no-print-directory all
	@scripts/run.sh

clean:
	rm -rf build build-asan build-fuzz

.PHONY: deps-quiet fuzzers
-include $(shell find build build-asan -name '*.d' 2>/dev/null)
