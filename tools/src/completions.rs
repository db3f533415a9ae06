//! Shell completion scripts for a command line of subcommands (`ringpost completions SHELL`),
//! written from the command tree argh derives (`argh::SubCommands::COMMANDS`) and each
//! command's usage line (`cli::usage_options`), so that they follow the commands as they
//! change: commands and their actions complete by name, options by name after a `-`: the
//! global ones everywhere, and each command's or action's own after it.

/// An option's name with its dashes (`--topic`), and whether a value follows it.
pub type OptionName = (String, bool);

/// A command and its actions, each with its one-line description and its own options (for a
/// command with actions, its actions have them).
pub struct CommandTree {
    pub name: &'static str,
    pub description: &'static str,
    pub options: Vec<OptionName>,
    pub actions: Vec<Action>,
}

/// An action of a command (`create` of `sub`).
pub struct Action {
    pub name: &'static str,
    pub description: &'static str,
    pub options: Vec<OptionName>,
}

/// The options taken anywhere on the line, and whether each takes a value.
pub struct Completion<'a> {
    pub program: &'a str,
    pub commands: &'a [CommandTree],
    pub options: &'a [(&'a str, bool)],
}

impl Completion<'_> {
    pub fn script(&self, shell: &str) -> Result<String, String> {
        match shell {
            "bash" => Ok(self.bash()),
            // zsh runs the bash function through its bashcompinit layer.
            "zsh" => Ok(format!(
                "#compdef {program}\nautoload -U +X bashcompinit && bashcompinit\n{}",
                self.bash(),
                program = self.program
            )),
            "fish" => Ok(self.fish()),
            other => Err(format!("unknown shell '{other}': use bash, zsh or fish")),
        }
    }

    fn function(&self) -> String {
        format!("_{}", self.program.replace('-', "_"))
    }

    /// Every option that takes a value, anywhere: the word after one is its value, never a
    /// command or an action.
    fn valued(&self) -> Vec<&str> {
        let own = self.commands.iter().flat_map(|command| {
            command.options.iter().chain(command.actions.iter().flat_map(|action| &action.options))
        });
        let mut valued: Vec<&str> = self
            .options
            .iter()
            .filter(|(_, value)| *value)
            .map(|(name, _)| *name)
            .chain(own.filter(|(_, value)| *value).map(|(name, _)| name.as_str()))
            .collect();
        valued.sort_unstable();
        valued.dedup();
        valued
    }

    fn bash(&self) -> String {
        let names = |options: &[OptionName]| {
            options.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>().join(" ")
        };
        let valued = self.valued();
        let options: Vec<&str> = self.options.iter().map(|(name, _)| *name).chain(["--help"]).collect();
        let commands: Vec<&str> = self.commands.iter().map(|command| command.name).collect();
        let mut actions = String::new();
        let mut own_options = String::new();
        for command in self.commands {
            if command.actions.is_empty() {
                if !command.options.is_empty() {
                    own_options.push_str(&format!(
                        "            {}) candidates+=\" {}\" ;;\n",
                        command.name,
                        names(&command.options)
                    ));
                }
                continue;
            }
            let action_names: Vec<&str> = command.actions.iter().map(|action| action.name).collect();
            actions.push_str(&format!(
                "            {}) candidates=\"{}\" ;;\n",
                command.name,
                action_names.join(" ")
            ));
            let mut cases = String::new();
            for action in command.actions.iter().filter(|action| !action.options.is_empty()) {
                cases.push_str(&format!(
                    "                    {}) candidates+=\" {}\" ;;\n",
                    action.name,
                    names(&action.options)
                ));
            }
            if !cases.is_empty() {
                own_options.push_str(&format!(
                    "            {})\n                case $action in\n{cases}                esac ;;\n",
                    command.name
                ));
            }
        }
        format!(
            r#"# {program} completion for bash: source it, or put it in /etc/bash_completion.d/{program}
{function}() {{
    local current=${{COMP_WORDS[COMP_CWORD]}} command= action= candidates= index
    for ((index = 1; index < COMP_CWORD; index++)); do
        case ${{COMP_WORDS[index]}} in
            {valued}) ((index++)) ;;
            -*) ;;
            *) if [[ -z $command ]]; then command=${{COMP_WORDS[index]}}; elif [[ -z $action ]]; then action=${{COMP_WORDS[index]}}; fi ;;
        esac
    done
    if [[ $current == -* ]]; then
        candidates="{options}"
        case $command in
{own_options}        esac
    elif [[ -z $command ]]; then
        candidates="{commands}"
    elif [[ -z $action ]]; then
        case $command in
{actions}        esac
    fi
    COMPREPLY=($(compgen -W "$candidates" -- "$current"))
}}
complete -F {function} {program}
"#,
            program = self.program,
            function = self.function(),
            valued = if valued.is_empty() { "--no-such-option".to_owned() } else { valued.join("|") },
            own_options = own_options,
            options = options.join(" "),
            commands = commands.join(" "),
        )
    }

    fn fish(&self) -> String {
        let program = self.program;
        let quote = |text: &str| text.replace('\\', "\\\\").replace('\'', "\\'");
        let mut script =
            format!("# {program} completion for fish: put it in ~/.config/fish/completions/{program}.fish\n");
        script.push_str(&format!("complete -c {program} -f\n"));
        for command in self.commands {
            script.push_str(&format!(
                "complete -c {program} -n '__fish_use_subcommand' -a {} -d '{}'\n",
                command.name,
                quote(command.description)
            ));
            let action_names: Vec<&str> = command.actions.iter().map(|action| action.name).collect();
            for action in &command.actions {
                script.push_str(&format!(
                    "complete -c {program} -n '__fish_seen_subcommand_from {}; and not __fish_seen_subcommand_from {}' -a {} -d '{}'\n",
                    command.name,
                    action_names.join(" "),
                    action.name,
                    quote(action.description)
                ));
                let condition = format!(
                    "__fish_seen_subcommand_from {}; and __fish_seen_subcommand_from {}",
                    command.name, action.name
                );
                script.push_str(&fish_options(program, &condition, &action.options));
            }
            let condition = format!("__fish_seen_subcommand_from {}", command.name);
            script.push_str(&fish_options(program, &condition, &command.options));
        }
        for (option, value) in self.options {
            let long = option.trim_start_matches("--");
            let takes = if *value { " -r" } else { "" };
            script.push_str(&format!("complete -c {program} -l {long}{takes}\n"));
        }
        script
    }
}

/// fish's lines completing `options` where `condition` holds.
fn fish_options(program: &str, condition: &str, options: &[OptionName]) -> String {
    options
        .iter()
        .map(|(name, value)| {
            let takes = if *value { " -r" } else { "" };
            format!("complete -c {program} -n '{condition}' -l {}{takes}\n", name.trim_start_matches("--"))
        })
        .collect()
}
