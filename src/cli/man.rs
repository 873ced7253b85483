//! `moss man --out-dir DIR`: moss.1 and one page per subcommand (moss-generate.1, ...), as the
//! pages' SEE ALSO sections name them.

use super::args::Cli;
use clap::CommandFactory;

/// `(file name, roff)` of every page: the top command's, then each visible subcommand's (named
/// by clap's display name, `moss-generate`, as `clap_mangen::generate_to` names them).
pub fn pages() -> Vec<(String, Vec<u8>)> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut cmds = vec![cmd.clone()];
    cmds.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    cmds.into_iter()
        .map(|c| {
            let man = clap_mangen::Man::new(c);
            let mut roff = vec![];
            man.render(&mut roff).expect("rendering to memory does not fail");
            (man.get_filename(), roff)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_page_per_visible_subcommand() {
        let pages = super::pages();
        let names: Vec<&str> = pages.iter().map(|p| p.0.as_str()).collect();
        for want in ["moss.1", "moss-generate.1", "moss-serve.1", "moss-info.1", "moss-man.1"] {
            assert!(names.contains(&want), "{names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("bench")), "hidden subcommands get no page: {names:?}");
        let generate = String::from_utf8(pages.iter().find(|p| p.0 == "moss-generate.1").unwrap().1.clone()).unwrap();
        assert!(generate.contains(".TH moss-generate") && generate.contains("cfg\\-scale") && generate.contains("\\-\\-force"), "{generate}");
    }
}
