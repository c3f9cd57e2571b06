//! pluginsync-agent: not built yet (see the agent issue).

fn main() {
    eprintln!("error: pluginsync-agent is not implemented yet");
    std::process::exit(1);
}
