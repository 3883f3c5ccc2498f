# The short front door. CMake is the build; this file installs what is missing, configures once,
# and names the things a newcomer runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
NVCC  := $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release $(if $(NVCC),-DCMAKE_CUDA_COMPILER=$(NVCC))

.PHONY: all setup configure build test gradcheck train sft dpo clean fuzz asan tsan

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja: | setup
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The tests also need a browser: the training report is checked in headless Chromium. Where it cannot
# be installed, that one test says so and is skipped. They start with `make fuzz` for TEST_FUZZ_SECONDS a
# harness: every layer compiled once more by clang (a clang-only compile error fails the tests, as GCC
# alone would not show it), and each reader of untrusted files run on its seed corpus under ASan + UBSan.
TEST_FUZZ_SECONDS ?= 5
test: build
	@scripts/setup.sh --test || echo "setup: Chromium could not be installed; the report page test will be skipped"
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

gradcheck: build
	$(BUILD)/lingtrain gradcheck

clean:
	rm -rf $(BUILD)

# The main job: pre-train the default (tiny) Ling MoE on the embedded corpus, report train and
# held-out loss and the accuracy on the embedded multiple-choice task (500 items made from held-out
# documents, chance 0.25), write the checkpoint to out/tiny/checkpoint and print a sample.
# It ends by writing the training report, out/tiny/report.html (README "The training report").
TRAIN_FLAGS ?=
train: build
	$(BUILD)/lingtrain pretrain --model tiny --out out/tiny --eval-mc embedded $(TRAIN_FLAGS)
	$(BUILD)/lingtrain report --run out/tiny

# Post-training on the embedded tool-use data (docs/post_training.md), each printing its held-out
# figures before and after. sft starts from out/tiny/checkpoint (`make train` makes it when missing):
# first 1000 steps on copy instructions (the tiny model cannot copy an unseen name from a question into a
# call until it has learned to copy), then the tool conversations. dpo starts from out/sft/checkpoint
# (`make sft` makes it when missing). Tool use is scored by the model playing 600 held-out tool
# conversations (829 calls) about people and companies it never saw in training.
COPY_FLAGS ?= --steps 1000
SFT_FLAGS ?= --epochs 1
# A stronger NLL term than Ling's 0.05 and a larger beta than TRL's 0.1 keep DPO from eroding the tool
# calls SFT taught (docs/post_training.md has the measurements).
DPO_FLAGS ?= --rpo-alpha 10 --beta 0.5
TOOLS := out/tool
EVAL_TOOLS = $(BUILD)/lingtrain eval-tools --data $(TOOLS)/sft_val.jsonl --graph $(TOOLS)/knowledge_graph.json --limit 800
sft: build
	@[ -e out/tiny/checkpoint/model.safetensors ] || $(MAKE) --no-print-directory train
	@[ -e $(TOOLS)/copy_train.jsonl ] || $(BUILD)/lingtrain tool-data --out $(TOOLS)
	$(EVAL_TOOLS) --ckpt out/tiny/checkpoint >$(TOOLS)/tool_use_pretrained.json
	$(BUILD)/lingtrain sft --ckpt out/tiny/checkpoint --data $(TOOLS)/copy_train.jsonl --val $(TOOLS)/copy_val.jsonl \
	  --out out/sft-copy $(COPY_FLAGS)
	$(BUILD)/lingtrain sft --ckpt out/sft-copy/checkpoint --data $(TOOLS)/sft_train.jsonl --val $(TOOLS)/sft_val.jsonl \
	  --out out/sft $(SFT_FLAGS)
	$(EVAL_TOOLS) --ckpt out/sft/checkpoint >$(TOOLS)/tool_use_sft.json
	@echo "held-out tool use, pre-trained: $$(cat $(TOOLS)/tool_use_pretrained.json)"
	@echo "held-out tool use, after SFT:   $$(cat $(TOOLS)/tool_use_sft.json)"

dpo: build
	@[ -e out/sft/checkpoint/model.safetensors ] || $(MAKE) --no-print-directory sft
	@[ -e $(TOOLS)/tool_use_sft.json ] || $(EVAL_TOOLS) --ckpt out/sft/checkpoint >$(TOOLS)/tool_use_sft.json
	$(BUILD)/lingtrain dpo --ckpt out/sft/checkpoint --data $(TOOLS)/dpo_train.jsonl --val $(TOOLS)/dpo_val.jsonl \
	  --out out/dpo $(DPO_FLAGS) >$(TOOLS)/dpo_summary.json && cat $(TOOLS)/dpo_summary.json
	$(EVAL_TOOLS) --ckpt out/dpo/checkpoint >$(TOOLS)/tool_use_dpo.json
	@echo "held-out preferences before DPO (the SFT model): $$(head -1 out/dpo/metrics.jsonl)"
	@echo "held-out preferences after DPO: $$(grep -o '"eval_.*"val_unigram' $(TOOLS)/dpo_summary.json)"
	@echo "held-out tool use, after SFT: $$(cat $(TOOLS)/tool_use_sft.json)"
	@echo "held-out tool use, after DPO: $$(cat $(TOOLS)/tool_use_dpo.json)"

# libFuzzer on the readers of untrusted files (tests/fuzz/), under ASan and UBSan, in its own clang build
# (build-fuzz/), which compiles every layer's library, not only those the harnesses link. Each harness
# runs FUZZ_SECONDS on a scratch copy of its seed corpus, so the repository's corpus stays as committed;
# a crash leaves its input as build-fuzz/crash-* and stops `make fuzz`. `make test` starts with a short
# run (TEST_FUZZ_SECONDS); `make fuzz FUZZ_SECONDS=600` for the long one.
FUZZ_BUILD    ?= build-fuzz
FUZZ_SECONDS  ?= 60
FUZZ_HARNESSES := safetensors shard config trainer_json tokenizer chat multiple_choice
fuzz:
	@scripts/setup.sh --fuzz
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" -DLINGTRAIN_CUDA=OFF -DLINGTRAIN_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@set -e; for harness in $(FUZZ_HARNESSES); do \
	  corpus=$(FUZZ_BUILD)/corpus/$$harness; rm -rf $$corpus; mkdir -p $$corpus; \
	  cp tests/fuzz/corpus/$$harness/* $$corpus/; \
	  echo "== fuzz_$$harness for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_BUILD)/fuzz_$$harness $$corpus -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crash-$$harness- 2> $(FUZZ_BUILD)/fuzz_$$harness.log \
	    || { tail -40 $(FUZZ_BUILD)/fuzz_$$harness.log; exit 1; }; \
	  grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' $(FUZZ_BUILD)/fuzz_$$harness.log; \
	done

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

# ThreadSanitizer over the tests that run threads: the pool itself, the background checkpoint writer, the
# Highway kernels inside the pool, the autograd ops and whole training steps (the determinism tests).
# Clean means no report at all.
# UCX (under MPICH) hooks madvise, which a thread calls as it exits; its hook takes a lock TSan's
# interceptor is not ready for, and the process crashes. UCX_MEM_MMAP_HOOK_MODE=none turns the hook off.
TSAN_FILTER := ThreadPool.*:BackgroundTask.*:*Kernel*.*:MoEStats.*:ScaleBy.*:Router.*:NormHead*.*:Engine.*:*GradCheck*.*:Profile.*:QkvAttention.*:Determinism.*:Training.*
tsan: setup
	cmake -S . -B build-tsan $(SAN_CMAKE_FLAGS) -DLINGTRAIN_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS) --target lingtrain_tests
	UCX_MEM_MMAP_HOOK_MODE=none TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  build-tsan/lingtrain_tests --gtest_filter='$(TSAN_FILTER)'
