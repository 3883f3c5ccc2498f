# The short front door. CMake is the build; this file installs what is missing, configures once,
# and names the things a newcomer runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
NVCC  := $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release $(if $(NVCC),-DCMAKE_CUDA_COMPILER=$(NVCC))

.PHONY: all setup configure build test gradcheck train clean asan tsan

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja: | setup
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

gradcheck: build
	$(BUILD)/lingtrain gradcheck

clean:
	rm -rf $(BUILD)

# The main job: pre-train the default (tiny) Ling MoE on the embedded corpus, report train and
# held-out loss, write the checkpoint to out/tiny/checkpoint and print a sample.
TRAIN_FLAGS ?=
train: build
	$(BUILD)/lingtrain pretrain --model tiny --out out/tiny $(TRAIN_FLAGS)

# Sanitizer runs, each in its own build folder, kept out of `make test` (they take several times longer).
# CPU only: the CUDA paths are not compiled. Set CMAKE_CXX_COMPILER_LAUNCHER=ccache in the environment
# to cache the compiles.
SAN_CMAKE_FLAGS := -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLINGTRAIN_CUDA=OFF

# ASan + UBSan + LeakSanitizer over the whole CTest suite but the benchmark (cli.bench, a speed
# measurement that says nothing more under a sanitizer).
asan: setup
	cmake -S . -B build-asan $(SAN_CMAKE_FLAGS) -DLINGTRAIN_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	ctest --test-dir build-asan --output-on-failure -j $(JOBS) -E '^cli\.bench$$'

# ThreadSanitizer over the tests that run threads: the pool itself, the Highway kernels inside it, the
# autograd ops and whole training steps (the determinism tests). Clean means no report at all.
TSAN_FILTER := ThreadPool.*:*Kernel*.*:MoEStats.*:ScaleBy.*:Router.*:NormHead*.*:Engine.*:*GradCheck*.*:Profile.*:QkvAttention.*:Determinism.*:Training.*
tsan: setup
	cmake -S . -B build-tsan $(SAN_CMAKE_FLAGS) -DLINGTRAIN_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS) --target lingtrain_tests
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 build-tsan/lingtrain_tests --gtest_filter='$(TSAN_FILTER)'
