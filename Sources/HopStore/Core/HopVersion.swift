/// The version of Hop this binary was built from (see CHANGELOG.md).
public enum HopVersion {
    /// The release, as `hopctl --version` and `hop-demo --version` print it.
    public static let current = "0.2.0"
}
