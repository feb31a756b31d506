/// A step that is finished from outside the engine: by ``HopEngine/unhop(flow:subject:token:output:)``,
/// by `hopctl unhop`, or by a stored change. While it waits, its run holds no task and no memory.
public struct ExternalStep: Sendable {
    let wakeOn: WakeCondition?

    /// Finished by an explicit unhop only.
    public static let external = ExternalStep(wakeOn: nil)

    /// Finished by an explicit unhop, or when `condition` happens (e.g. a session is stored by `hopctl session login`).
    public static func external(unhopWhen condition: WakeCondition) -> ExternalStep { ExternalStep(wakeOn: condition) }
}
