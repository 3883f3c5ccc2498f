// The commands of `lingtrain`, one family per file: run_commands.cpp (pretrain, sft, dpo),
// eval_commands.cpp (eval, sample, score, eval-tools), multiple_choice_commands.cpp (eval-mc, mc-data),
// data_commands.cpp (shards, tokenizer, chat-template, tool-data), inspect_commands.cpp (inspect, report),
// tool_commands.cpp (version, gradcheck, params, bench). Each reads its flags with cli/flags.h and runs
// what it asks for; the layers below know nothing of flags or output formats.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

namespace lt::cli {

using Args = std::vector<std::string>;  // the arguments after the command's name

int cmd_version(const Args& args);
int cmd_gradcheck(const Args& args);
int cmd_params(const Args& args);
int cmd_compare(const Args& args);
int cmd_plan(const Args& args);
int cmd_bench(const Args& args);
int cmd_pretrain(const Args& args);
int cmd_sft(const Args& args);
int cmd_dpo(const Args& args);
int cmd_eval(const Args& args);
int cmd_sample(const Args& args);
int cmd_score(const Args& args);
int cmd_eval_tools(const Args& args);
int cmd_eval_mc(const Args& args);
int cmd_mc_data(const Args& args);
int cmd_shards(const Args& args);
int cmd_tokenizer(const Args& args);
int cmd_chat_template(const Args& args);
int cmd_tool_data(const Args& args);
int cmd_inspect(const Args& args);
int cmd_report(const Args& args);

using Command = int (*)(const Args& args);
// The command of that name (--version too); nullptr when there is none.
Command find_command(const std::string& name);
// The overview of every command (lingtrain --help).
void print_usage(std::FILE* out);

}  // namespace lt::cli
