# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
OUT    := results

.PHONY: demo test bench venv clean

venv: $(STAMP)

# torch first and exactly: `pip install torch==2.13.0` takes the CPU wheel on disk.
# The native data path (src/dlcomm/native/csrc) is compiled by pip install with gcc.
$(STAMP): pyproject.toml setup.py $(wildcard src/dlcomm/native/csrc/*.c src/dlcomm/native/csrc/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# As root the demo runs on an emulated 100 Mbit/s star (network namespaces); else on loopback.
NET := $(shell [ "$$(id -u)" = 0 ] && echo "--network emulated --bandwidth 100mbit")
DEMO := --workload digits-cnn --workers 4 --epochs 5 $(NET)

demo: $(STAMP)
	mkdir -p $(OUT)
	$(VENV)/bin/dlcomm train $(DEMO) --exchange ring --json $(OUT)/demo-ring.json
	$(VENV)/bin/dlcomm train $(DEMO) --exchange switch --json $(OUT)/demo-switch.json
	$(VENV)/bin/dlcomm compare $(OUT)/demo-ring.json $(OUT)/demo-switch.json --plot $(OUT)/demo.png

# The suite runs on the native dataplane; the tests of live switches' packet paths run again
# on the Python one (the pure dataplane tests are the same either way).
SWITCH_LIVE := tests/switch/test_findings_packets.py tests/switch/test_live_fuzz.py \
	tests/switch/test_metrics.py tests/switch/test_on_path.py
test: $(STAMP)
	$(PY) -m pytest -q
	DLCOMM_DATAPLANE=python $(PY) -m pytest -q $(SWITCH_LIVE)

# Measurements, not tests: long fuzzing/soak runs, then every benchmark writes JSON to $(BENCH).
# The emulated ones need root. Each command compares its variants side by side in one run.
BENCH := $(OUT)/bench
DL := $(VENV)/bin/dlcomm
EMU1G := --network emulated --bandwidth 1gbit

bench: $(STAMP)
	mkdir -p $(BENCH)
	$(PY) -m pytest -q -m "slow or bench"
	$(DL) bench fidelity --json $(BENCH)/fidelity.json
	$(DL) bench fuzz --json $(BENCH)/fuzz.json
	# the native decoder: a coverage-guided campaign (gcc's trace-pc driver; without --gcc,
	# libFuzzer where clang exists) from a seed corpus, then the sanitizer replay of all it found
	rm -rf build/fuzz && mkdir -p build/fuzz/seeds build/fuzz/found
	$(PY) -c "from dlcomm.testing.native_corpus import write_corpus; write_corpus('build/fuzz/seeds', 3000, 1)"
	$(PY) -m dlcomm.native.harness fuzzer build/fuzz --gcc
	$(PY) -m dlcomm.native.harness sanitized build/fuzz
	build/fuzz/dlc_fuzz -t 600 -s 1 -o build/fuzz/found build/fuzz/seeds
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build/fuzz/dlc_replay build/fuzz/seeds build/fuzz/found
	# the worker's socket loop on loopback (fuzz_socket.c: one configuration byte, then records)
	mkdir -p build/fuzz/socket-seeds build/fuzz/socket-found
	$(PY) -c "from dlcomm.testing.socket_corpus import write_socket_corpus; write_socket_corpus('build/fuzz/socket-seeds', 40, 1)"
	$(PY) -m dlcomm.native.harness fuzzer build/fuzz --gcc --target sockets
	$(PY) -m dlcomm.native.harness sanitized build/fuzz --target sockets
	build/fuzz/dlc_fuzz_sockets -t 300 -s 1 -H 1 -o build/fuzz/socket-found build/fuzz/socket-seeds
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build/fuzz/dlc_replay_sockets build/fuzz/socket-seeds build/fuzz/socket-found
	# the switch's threads under ThreadSanitizer, 20 s (tests/native/test_threads.py runs 1 s)
	$(PY) -m dlcomm.native.harness threads build/fuzz
	TSAN_OPTIONS=halt_on_error=1:exitcode=66 build/fuzz/dlc_threads 20
	$(DL) bench switch --json $(BENCH)/switch-rate.json --plot $(BENCH)/switch-rate.png
	# the c10d backend against the DDP hook, the same job (emulated: root)
	$(DL) bench backend --reps 3 --workload digits-cnn --workers 4 --epochs 2 --exchange switch $(NET) --json $(BENCH)/backend.json
	$(DL) bench auth --json $(BENCH)/auth.json
	$(DL) bench allreduce --exchange "switch:auth=none,switch,switch:auth=encrypted" --workers 4 --size 100MB --reps 30 --interleave $(EMU1G) --json $(BENCH)/switch-auth.json
	$(DL) bench allreduce --exchange ring,switch --workers 4 --size 100MB $(EMU1G) --json $(BENCH)/switch-n4-1gbit.json
	$(DL) bench allreduce --exchange ring,switch --workers 8 --size 100MB --network emulated --bandwidth 500mbit --json $(BENCH)/switch-n8-500mbit.json
	$(DL) bench allreduce --exchange ring,switch --workers 4 --size 100MB --json $(BENCH)/switch-loopback.json
	$(DL) bench allreduce --exchange ring,switch --workers 4 --size 100MB $(EMU1G) --drop-rate 0.01 --json $(BENCH)/switch-loss1.json
	$(DL) bench allreduce --exchange "switch:k=256,switch:k=1024,switch:k=4096,switch:k=16000" --workers 4 --size 20MB $(EMU1G) --json $(BENCH)/switch-k.json
	$(DL) bench allreduce --exchange "switch:window=1,switch:window=2,switch:window=4,switch:window=8,switch:window=16,switch:window=32" --workers 4 --size 50MB $(EMU1G) --json $(BENCH)/switch-window.json
	$(DL) bench allreduce --exchange "switch,switch:drop=0.001,switch:drop=0.01,switch:drop=0.05" --workers 4 --size 50MB $(EMU1G) --json $(BENCH)/switch-loss.json
	for n in 4 8; do for pattern in shared independent elementwise; do for d in 0.01 0.05 0.1 0.25 0.5 1.0; do \
	  $(DL) bench allreduce --exchange ring,switch,sparse-switch,auto --workers $$n --size 100MB --reps 5 \
	    --density $$d --pattern $$pattern $(EMU1G) --json $(BENCH)/sparse-n$$n-$$pattern-$$d.json; \
	done; done; done
	$(DL) bench compression --parts throughput,accuracy,train,emulate --bandwidths 100mbit,1gbit,10gbit --repeats 3 \
	  --json $(BENCH)/compression.json --plot $(BENCH)/compression.png
	$(DL) bench sync --json $(BENCH)/sync.json --plot $(BENCH)/sync.png
	$(DL) simulate validate --json $(BENCH)/simulate-validate.json
	$(DL) simulate reproduce switchml --json $(BENCH)/simulate-switchml.json
	$(DL) simulate reproduce hammingmesh --json $(BENCH)/simulate-hammingmesh.json
	for model in resnet50 vgg19 bert-large; do \
	  $(DL) emulate --workload $$model --workers 8 --bandwidth 10gbit --exchange ring,switch --iterations 2 --json $(BENCH)/emulate-$$model.json; \
	done

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .hypothesis
