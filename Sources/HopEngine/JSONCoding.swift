import Foundation

/// JSON as Hop stores it: step outputs and decision values.
enum JSONCoding {
    static func encode(_ value: some Encodable) throws -> String {
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            encoder.dateEncodingStrategy = .millisecondsSince1970
            return String(decoding: try encoder.encode(value), as: UTF8.self)
        } catch {
            throw HopEngineError(.encoding, "cannot encode \(type(of: value)) as JSON: \(error)")
        }
    }

    static func decode<T: Decodable>(_ type: T.Type, from json: String, what: String) throws -> T {
        do {
            let decoder = JSONDecoder()
            decoder.dateDecodingStrategy = .millisecondsSince1970
            return try decoder.decode(type, from: Data(json.utf8))
        } catch {
            throw HopEngineError(.encoding, "cannot decode \(what) as \(type): \(error)")
        }
    }
}

/// How a hop ended.
public enum StepEnding: Sendable, Equatable {
    /// The step unhopped.
    case unhopped
    /// The step's deadline passed first (see ``FlowRun/hop(to:timeout:transition:)``).
    case timedOut
    /// A change of stored state ended the step (e.g. a logout ended a `main` step declared
    /// with `.external(unhopWhen: .sessionRemoved)`); the flow should take another path.
    case rerouted
}

/// The result of a hop: how the step ended, and the output it unhopped with.
public struct StepOutput: Sendable, Equatable {
    /// The output as JSON text; `nil` when the step unhopped without one, timed out or was re-routed.
    public let json: String?
    /// How the step ended.
    public let ending: StepEnding

    public init(json: String?, ending: StepEnding = .unhopped) {
        self.json = json
        self.ending = ending
    }

    /// Whether the step's deadline passed before it unhopped: take the flow's timeout branch.
    public var timedOut: Bool { ending == .timedOut }

    /// Whether a change of stored state ended the step: take the flow's other path.
    public var rerouted: Bool { ending == .rerouted }

    /// The output decoded as `T`; `nil` when there is none.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T? {
        guard let json else { return nil }
        return try JSONCoding.decode(type, from: json, what: "a step output")
    }
}
