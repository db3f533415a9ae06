//! Shell completion scripts for a command line of subcommands (`ringpost completions SHELL`),
//! written from the command tree argh derives (`argh::SubCommands::COMMANDS`), so that they
//! follow the commands as they change: commands and their actions complete by name, options
//! by name after a `-`.

/// A command and its actions, each with its one-line description.
pub struct CommandTree {
    pub name: &'static str,
    pub description: &'static str,
    pub actions: Vec<(&'static str, &'static str)>,
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

    fn bash(&self) -> String {
        let valued: Vec<&str> =
            self.options.iter().filter(|(_, value)| *value).map(|(name, _)| *name).collect();
        let options: Vec<&str> = self.options.iter().map(|(name, _)| *name).chain(["--help"]).collect();
        let commands: Vec<&str> = self.commands.iter().map(|command| command.name).collect();
        let mut actions = String::new();
        for command in self.commands.iter().filter(|command| !command.actions.is_empty()) {
            let names: Vec<&str> = command.actions.iter().map(|(name, _)| *name).collect();
            actions.push_str(&format!(
                "            {}) candidates=\"{}\" ;;\n",
                command.name,
                names.join(" ")
            ));
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
            for (action, description) in &command.actions {
                script.push_str(&format!(
                    "complete -c {program} -n '__fish_seen_subcommand_from {}; and not __fish_seen_subcommand_from {}' -a {action} -d '{}'\n",
                    command.name,
                    command.actions.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(" "),
                    quote(description)
                ));
            }
        }
        for (option, value) in self.options {
            let long = option.trim_start_matches("--");
            let takes = if *value { " -r" } else { "" };
            script.push_str(&format!("complete -c {program} -l {long}{takes}\n"));
        }
        script
    }
}
