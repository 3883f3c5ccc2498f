# The short front door. CMake is the build; this file installs what is missing, configures once,
# and names the things a newcomer runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
NVCC  := $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release $(if $(NVCC),-DCMAKE_CUDA_COMPILER=$(NVCC))

.PHONY: all setup configure build test gradcheck train clean

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
